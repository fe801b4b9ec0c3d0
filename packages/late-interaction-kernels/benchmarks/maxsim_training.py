"""MaxSim forward + backward (one training step's scoring) per backward method, against einsum.

    python3 packages/late-interaction-kernels/benchmarks/maxsim_training.py --out training.json [--quick]

Shapes are the issue's training loops: PyLate-like in-batch B256 (Lq 32, Ld 300), ColPali in-batch
B128 (Lq 32, Ld 1030), and ColPali hard negatives B128×8 and B256×16 (the 4-D layout, each query
against its own K documents). bf16 inputs and gradients. Each of ``unified``, ``lowmem`` and
``auto`` gets a record with its time and peak memory; the eager einsum baseline is timed once per
shape and repeated in each record (a baseline that runs out of memory is recorded as such).
"""

from __future__ import annotations

import time

import torch

from late_interaction_kernels import maxsim
from late_interaction_kernels.ops.maxsim import resolve_backward
from triton_dispatch.bench import benchmark_arguments, compare, report

# name, (B, K or None for in-batch all-pairs, Lq, Ld, d), best published figure (ms)
CASES = [
    ("pylate-in-batch-b256", (256, None, 32, 300, 128), 1.79),
    ("colpali-in-batch-b128", (128, None, 32, 1030, 128), 1.12),
    ("colpali-hard-negatives-b128x8", (128, 8, 32, 1030, 128), 0.61),
    ("colpali-hard-negatives-b256x16", (256, 16, 32, 1030, 128), 0.80),
]
QUICK = [
    ("pylate-in-batch-b32", (32, None, 32, 300, 128), None),
    ("hard-negatives-b16x4", (16, 4, 32, 300, 128), None),
]
METHODS = ("unified", "lowmem", "auto")


def einsum_scores(Q: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    if D.dim() == 3:
        sim = torch.einsum("qid,njd->qnij", Q, D)
    else:
        sim = torch.einsum("qid,qkjd->qkij", Q, D)
    return sim.amax(dim=-1).float().sum(dim=-1)


def step(fn, Q, D, grad):
    def run():
        Q.grad = D.grad = None
        fn(Q, D).backward(grad)

    return run


def main() -> None:
    parser = benchmark_arguments(__doc__.splitlines()[0])
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    records = []
    started = time.perf_counter()
    for name, (b, k, lq, ld, dim), published in QUICK if args.quick else CASES:
        gen = torch.Generator(device="cpu").manual_seed(0)
        Q = torch.randn(b, lq, dim, generator=gen).to(device, dtype).requires_grad_()
        d_shape = (b, ld, dim) if k is None else (b, k, ld, dim)
        D = torch.randn(d_shape, generator=gen).to(device, dtype).requires_grad_()
        grad = torch.randn(b, b if k is None else k, generator=gen).to(device)
        shape = {"B": b, "K": k or "in-batch", "Lq": lq, "Ld": ld, "d": dim, "dtype": str(dtype)[6:]}
        baseline = step(einsum_scores, Q, D, grad)
        first = None
        for method in METHODS:
            chosen = resolve_backward(method, 0 if k is None else 1, b, b if k is None else k, lq)
            rec = compare(
                f"train:{name}:{method}",
                shape,
                ours=step(lambda q, d, m=method: maxsim(q, d, backward=m), Q, D, grad),
                baseline=baseline if first is None else None,
                baseline_name="einsum fwd+bwd (eager)",
                device=device,
                extra={"published_best_ms": published, "method": method, "resolved": chosen},
            )
            if first is None:
                first = rec
            else:
                rec.baseline_ms = first.baseline_ms
                rec.baseline_peak_bytes = first.baseline_peak_bytes
                if "baseline_error" in first.extra:
                    rec.extra["baseline_error"] = first.extra["baseline_error"]
            records.append(rec)
        del Q, D, grad
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"{name}: done at {time.perf_counter() - started:.0f}s", flush=True)
    report(records, args.out, meta={"script": "maxsim_training.py", "quick": args.quick})


if __name__ == "__main__":
    main()
