"""MaxSim forward (scoring) against the einsum + max + sum a user writes, eager and torch.compile'd.

    python3 packages/late-interaction-kernels/benchmarks/maxsim_forward.py --out forward.json [--quick]

Shapes (Nq, Nd, Lq, Ld, d) are the issue's: reranking, ColPali reranking, corpus scoring, in-batch
training squares, long queries, and small d. bf16 inputs, scores in fp32, no gradients. The
compiled baseline is measured on a subset of shapes only (each shape is a fresh inductor
compilation of ~10 s; the script must stay under 4 minutes): the others say so in ``extra``.
"""

from __future__ import annotations

import time

import torch

from late_interaction_kernels import maxsim
from triton_dispatch.bench import benchmark_arguments, compare, report

# name, (Nq, Nd, Lq, Ld, d), best published figure in ms (H100, bf16), compile the baseline?
CASES = [
    ("rerank", (1, 1000, 32, 300, 128), 0.041, True),
    ("rerank-long-doc", (1, 1000, 32, 1024, 128), 0.102, False),
    ("colpali-rerank", (1, 1000, 128, 1024, 128), 0.103, True),
    ("colpali-rerank-long-query", (1, 1000, 1024, 1024, 128), 0.601, False),
    ("corpus", (1, 10000, 32, 300, 128), 0.260, False),
    ("in-batch-32", (32, 32, 32, 300, 128), 0.028, True),
    ("in-batch-128", (128, 128, 32, 300, 128), 0.227, True),
    ("long-queries", (32, 32, 1024, 1024, 128), 0.501, False),
    ("in-batch-32-d48", (32, 32, 32, 300, 48), None, False),
    ("in-batch-32-d64", (32, 32, 32, 300, 64), None, False),
]
QUICK = [
    ("rerank", (1, 200, 32, 300, 128), None, True),
    ("in-batch-32-d48", (32, 32, 32, 300, 48), None, False),
]


def einsum_maxsim(Q: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    # what model code writes: the full (Nq, Nd, Lq, Ld) similarity, max over document tokens,
    # sum over query tokens in fp32
    return torch.einsum("qid,njd->qnij", Q, D).amax(dim=-1).float().sum(dim=-1)


def main() -> None:
    parser = benchmark_arguments(__doc__.splitlines()[0])
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cases = QUICK if args.quick else CASES
    compiled = torch.compile(einsum_maxsim, dynamic=False)
    records = []
    started = time.perf_counter()
    for name, (nq, nd, lq, ld, dim), published, do_compile in cases:
        gen = torch.Generator(device="cpu").manual_seed(0)
        Q = torch.randn(nq, lq, dim, generator=gen).to(device, dtype)
        D = torch.randn(nd, ld, dim, generator=gen).to(device, dtype)
        shape = {"Nq": nq, "Nd": nd, "Lq": lq, "Ld": ld, "d": dim, "dtype": str(dtype)[6:]}
        extra = {"published_best_ms": published}
        ours = lambda: maxsim(Q, D)
        with torch.no_grad():
            rec = compare(
                f"forward:{name}",
                shape,
                ours=ours,
                baseline=lambda: einsum_maxsim(Q, D),
                baseline_name="einsum+max+sum (eager)",
                device=device,
                extra=extra,
            )
            records.append(rec)
            if do_compile:
                rec_c = compare(
                    f"forward:{name}",
                    shape,
                    ours=ours,
                    baseline=lambda: compiled(Q, D),
                    baseline_name="einsum+max+sum (torch.compile)",
                    device=device,
                    extra=extra,
                )
                records.append(rec_c)
            else:
                rec.extra["compiled_baseline"] = "skipped to keep the script under 4 minutes"
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"{name}: done at {time.perf_counter() - started:.0f}s", flush=True)
    report(records, args.out, meta={"script": "maxsim_forward.py", "quick": args.quick})


if __name__ == "__main__":
    main()
