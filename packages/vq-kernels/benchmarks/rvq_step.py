"""Time a residual-VQ training step (3 levels x 256 codes x 64 dims: search, losses, backward and
the EMA update) with the fused kernels against the same module on the PyTorch reference path.

    python3 packages/vq-kernels/benchmarks/rvq_step.py --out rvq.json [--quick]
"""

from __future__ import annotations

import copy
import sys

import torch

from triton_dispatch.bench import benchmark_arguments, compare, report
from vq_kernels import ResidualVQ


def main() -> None:
    args = benchmark_arguments(__doc__).parse_args()
    device = torch.device(args.device)
    batches = [640] if args.quick else [640, 65536]
    records = []
    for batch in batches:
        torch.manual_seed(0)
        ours_module = ResidualVQ(64, 256, 3).to(device)
        ref_module = copy.deepcopy(ours_module)
        ref_module.backend = "torch"
        x = torch.randn(batch, 64, device=device, requires_grad=True)

        def step(module):
            out = module(x)
            (out.quantized.square().mean() + out.loss).backward()

        shape = {"B": batch, "L": 3, "K": 256, "D": 64}
        records.append(
            compare(
                "rvq_step",
                shape,
                ours=lambda: step(ours_module),
                baseline=lambda: step(ref_module),
                baseline_name="module, reference path",
                device=device,
            )
        )
    report(records, args.out, meta={"command": " ".join(sys.argv)})


if __name__ == "__main__":
    main()
