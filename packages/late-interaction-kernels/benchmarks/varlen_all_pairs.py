"""Packed all-pairs MaxSim (``maxsim_varlen``) on the packed tokens, against padding both sides
and calling ``maxsim`` with masks (what ``maxsim_varlen`` did before, and what a user of a padded
API does), forward and forward + backward, with peak memory above the inputs.

    python3 packages/late-interaction-kernels/benchmarks/varlen_all_pairs.py --out varlen.json [--quick]

Lengths are drawn uniformly from [Lmin, Lmax] (fixed seed); d = 128; bf16 on CUDA.
"""

from __future__ import annotations

import time

import torch

from late_interaction_kernels import maxsim
from late_interaction_kernels.ops.common.packed import check_offsets, pad
from late_interaction_kernels.varlen import maxsim_varlen
from triton_dispatch.bench import benchmark_arguments, compare, report

# name, Nq, (Lq min, max), Nd, (Ld min, max)
CASES = [
    ("in-batch-ragged-128", 128, (8, 32), 128, (50, 300)),
    ("rerank-ragged-1x1000", 1, (32, 32), 1000, (30, 300)),
    ("colpali-ragged-32x32", 32, (16, 64), 32, (600, 1030)),
]
QUICK = [("ragged-small", 4, (3, 9), 6, (5, 20))]


def _packed(n, lo, hi, gen, device, dtype):
    lengths = torch.randint(lo, hi + 1, (n,), generator=gen)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(device, torch.int32)
    x = torch.randn(int(lengths.sum()), 128, generator=gen).to(device, dtype)
    return x.requires_grad_(), cu, int(lengths.max())


def _padded_call(Q, D, cu_q, cu_d, lq, ld):
    Qp, qm = pad(Q, cu_q, check_offsets("cu_seqlens_q", cu_q, Q.shape[0]), lq)
    Dp, dm = pad(D, cu_d, check_offsets("cu_seqlens_d", cu_d, D.shape[0]), ld)
    return maxsim(Qp, Dp, qm, dm)


def main() -> None:
    args = benchmark_arguments(__doc__.splitlines()[0]).parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    records = []
    started = time.perf_counter()
    for name, nq, (qlo, qhi), nd, (dlo, dhi) in QUICK if args.quick else CASES:
        gen = torch.Generator().manual_seed(0)
        Q, cu_q, lq = _packed(nq, qlo, qhi, gen, device, dtype)
        D, cu_d, ld = _packed(nd, dlo, dhi, gen, device, dtype)
        g = torch.randn(nq, nd, generator=gen).to(device)
        shape = {"Nq": nq, "Lq": f"{qlo}-{qhi}", "Nd": nd, "Ld": f"{dlo}-{dhi}", "d": 128}
        ours = lambda: maxsim_varlen(Q, D, cu_q, cu_d, lq, ld)
        padded = lambda: _padded_call(Q, D, cu_q, cu_d, lq, ld)

        def train(fn):
            def step():
                Q.grad = D.grad = None
                fn().backward(g)

            return step

        with torch.no_grad():
            records.append(compare(f"varlen:{name}:forward", shape, ours=ours, baseline=padded,
                                   baseline_name="pad + maxsim", device=device))  # fmt: skip
        records.append(compare(f"varlen:{name}:train", shape, ours=train(ours),
                               baseline=train(padded), baseline_name="pad + maxsim",
                               device=device))  # fmt: skip
        print(f"{name}: done at {time.perf_counter() - started:.0f}s", flush=True)
    report(records, args.out, meta={"script": "varlen_all_pairs.py", "quick": args.quick})


if __name__ == "__main__":
    main()
