"""Smoke benchmark of the stack: the autotuned atomic ``column_sums`` kernel vs ``x.sum(0)``.

python shared/triton-dispatch/benchmarks/column_sums.py --out results.json
"""

from __future__ import annotations

import sys

import torch

from triton_dispatch.bench import benchmark_arguments, compare, report
from triton_dispatch.selfcheck import column_sums


def main() -> None:
    args = benchmark_arguments(__doc__.splitlines()[0]).parse_args()
    shapes = [(4096, 256)] if args.quick else [(4096, 256), (65536, 1024), (1 << 20, 64)]
    if args.device == "cpu":
        shapes = [(256, 64)]
    records = []
    for rows, cols in shapes:
        x = torch.randn(rows, cols, device=args.device)
        records.append(
            compare(
                "column_sums",
                {"rows": rows, "cols": cols},
                ours=lambda: column_sums(x),
                baseline=lambda: x.sum(0),
                baseline_name="torch.sum(0)",
                device=args.device,
            )
        )
    report(records, args.out, meta={"command": " ".join(sys.argv)})


if __name__ == "__main__":
    main()
