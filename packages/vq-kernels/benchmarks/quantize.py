"""Time the fused nearest-code search against torch.cdist + argmin and a matmul-based distance.

python3 packages/vq-kernels/benchmarks/quantize.py --out quantize.json [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _baselines import cdist_argmin, matmul_argmin

from triton_dispatch.bench import benchmark_arguments, compare, report
from vq_kernels import quantize

SHAPES = [
    (640, 256, 64),
    (4096, 256, 64),
    (16384, 1024, 64),
    (65536, 256, 64),
    (65536, 4096, 128),
    (16384, 16384, 64),
    (65536, 16384, 64),
]


def main() -> None:
    args = benchmark_arguments(__doc__).parse_args()
    device = torch.device(args.device)
    shapes = SHAPES[:2] if args.quick else SHAPES
    records = []
    for batch, num_codes, dim in shapes:
        g = torch.Generator(device="cpu").manual_seed(0)
        x32 = torch.randn(batch, dim, generator=g).to(device)
        cb32 = torch.randn(num_codes, dim, generator=g).to(device)
        for dtype in (torch.float32, torch.bfloat16):
            x, cb = x32.to(dtype), cb32.to(dtype)
            shape = {"B": batch, "K": num_codes, "D": dim, "dtype": str(dtype).split(".")[-1]}
            ours = lambda: quantize(x, cb)[0]
            baselines = {"matmul + argmin": lambda: matmul_argmin(x, cb)}
            if dtype == torch.float32:
                baselines["cdist + argmin"] = lambda: cdist_argmin(x, cb)
            for name, fn in baselines.items():
                records.append(
                    compare(
                        "quantize", shape, ours=ours, baseline=fn, baseline_name=name, device=device
                    )
                )
    report(records, args.out, meta={"command": " ".join(sys.argv)})


if __name__ == "__main__":
    main()
