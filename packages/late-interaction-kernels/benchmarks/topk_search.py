"""Fused top-k search (``maxsim_topk``) against ``maxsim`` + ``torch.topk``, time and peak memory.

    python3 packages/late-interaction-kernels/benchmarks/topk_search.py --out topk.json [--quick]

One query of 32 tokens against 100,000 documents of 300 tokens, d = 128, bf16, k = 100 (the
issue's shape), and a smaller collection to show that our peak memory does not grow with Nd while
the baseline's (the (Nq, Nd) score matrix) does. Peak memory is what the call allocates beyond
the inputs. Target: faster than the baseline, memory independent of Nd.
"""

from __future__ import annotations

import torch

from late_interaction_kernels import maxsim
from late_interaction_kernels.topk import maxsim_topk
from triton_dispatch.bench import benchmark_arguments, compare, report

CASES = [("corpus-100k", (1, 100_000, 32, 300, 128), 100), ("corpus-10k", (1, 10_000, 32, 300, 128), 100),
         ("batch-16x20k", (16, 20_000, 32, 300, 128), 100)]  # fmt: skip
QUICK = [("corpus-2k", (1, 2000, 32, 300, 128), 100)]


def main() -> None:
    args = benchmark_arguments(__doc__.splitlines()[0]).parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    records = []
    for name, (nq, nd, lq, ld, dim), k in QUICK if args.quick else CASES:
        gen = torch.Generator().manual_seed(0)
        Q = torch.randn(nq, lq, dim, generator=gen).to(device, dtype)
        D = torch.randn(nd, ld, dim, generator=gen).to(device, dtype)
        with torch.no_grad():
            ours_s, _ = maxsim_topk(Q, D, k)
            base_s, _ = maxsim(Q, D).topk(k, dim=1)
            agree = float((ours_s - base_s).abs().max())
            rec = compare(
                f"topk:{name}", {"Nq": nq, "Nd": nd, "Lq": lq, "Ld": ld, "d": dim, "k": k},
                ours=lambda: maxsim_topk(Q, D, k),
                baseline=lambda: maxsim(Q, D).topk(k, dim=1),
                baseline_name="maxsim + torch.topk", device=device,
                extra={"max_score_difference": agree},
            )  # fmt: skip
        records.append(rec)
        print(f"{rec.name}: done", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report(records, args.out, meta={"script": "topk_search.py", "quick": args.quick})


if __name__ == "__main__":
    main()
