"""Time a residual-VQ training step (3 levels x 256 codes x 64 dims: search, losses, backward and
the EMA update): the module on the fused search against the same module on the PyTorch reference
path and on the per-level search, and the step captured as one CUDA graph (CapturedStep) against
the eager step. Each record has GPU time (do_bench) and wall time per call.

    python3 packages/vq-kernels/benchmarks/rvq_step.py --out rvq.json [--quick]
"""

from __future__ import annotations

import copy
import sys

import torch

from triton_dispatch import CapturedStep
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
        levels_module = copy.deepcopy(ours_module)
        levels_module.fused = False
        graphed_module = copy.deepcopy(ours_module)
        x = torch.randn(batch, 64, device=device, requires_grad=True)
        # the captured step reads its own input (its backward accumulates into its own .grad)
        static_x = x.detach().clone().requires_grad_()

        def step(module, x=x):
            out = module(x)
            loss = out.quantized.square().mean() + out.loss
            loss.backward()
            return loss

        shape = {"B": batch, "L": 3, "K": 256, "D": 64}
        eager = lambda: step(ours_module)
        cases = [
            ("rvq_step", eager, lambda: step(ref_module), "module, reference path"),
            (
                "rvq_step fused search",
                eager,
                lambda: step(levels_module),
                "module, one quantize per level",
            ),
        ]
        if device.type == "cuda":
            captured = CapturedStep(lambda: step(graphed_module, static_x), warmup=3)
            cases.append(("rvq_step captured", captured, eager, "eager step (fused search)"))
        for name, ours, baseline, baseline_name in cases:
            records.append(
                compare(
                    name,
                    shape,
                    ours=ours,
                    baseline=baseline,
                    baseline_name=baseline_name,
                    device=device,
                )
            )
    report(records, args.out, meta={"command": " ".join(sys.argv)})


if __name__ == "__main__":
    main()
