"""PLAID candidate pruning (``plaid_approx_score``): the Triton kernel against the chunked PyTorch
gather it replaces, time and peak memory.

    python3 packages/late-interaction-kernels/benchmarks/plaid_approx.py --out plaid.json [--quick]

A ColBERTv2-sized index: 65,536 centroids, a 32-token query (the ``(n_centroids, Lq)`` table of
centroid scores precomputed, as PLAID does), candidate documents of up to 300 codes with random
lengths. The baseline is the same function with ``backend="torch"``.
"""

from __future__ import annotations

import torch

from late_interaction_kernels.plaid import plaid_approx_score
from triton_dispatch.bench import benchmark_arguments, compare, report

CASES = [("candidates-100k", (65_536, 32, 100_000, 300)), ("candidates-10k", (65_536, 32, 10_000, 300))]  # fmt: skip
QUICK = [("candidates-256", (4096, 32, 256, 64))]


def main() -> None:
    args = benchmark_arguments(__doc__.splitlines()[0]).parse_args()
    device = torch.device(args.device)
    records = []
    for name, (n_centroids, lq, batch, max_ld) in QUICK if args.quick else CASES:
        gen = torch.Generator().manual_seed(0)
        qcs = torch.randn(n_centroids, lq, generator=gen).to(device)
        codes = torch.randint(0, n_centroids, (batch, max_ld), generator=gen, dtype=torch.int32)
        lengths = torch.randint(max_ld // 4, max_ld + 1, (batch,), generator=gen)
        codes, lengths = codes.to(device), lengths.to(device)
        ours = plaid_approx_score(qcs, codes, lengths)
        base = plaid_approx_score(qcs, codes, lengths, backend="torch")
        rec = compare(
            f"plaid_approx:{name}", {"n_centroids": n_centroids, "Lq": lq, "B": batch, "max_Ld": max_ld},
            ours=lambda: plaid_approx_score(qcs, codes, lengths),
            baseline=lambda: plaid_approx_score(qcs, codes, lengths, backend="torch"),
            baseline_name="chunked torch gather", device=device,
            extra={"max_abs_difference": float((ours - base).abs().max())},
        )  # fmt: skip
        records.append(rec)
        print(f"{rec.name}: done", flush=True)
    report(records, args.out, meta={"script": "plaid_approx.py", "quick": args.quick})


if __name__ == "__main__":
    main()
