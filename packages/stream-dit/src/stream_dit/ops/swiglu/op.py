"""``swiglu``'s declaration: from it ``triton_dispatch`` derives the custom op
``stream_dit::swiglu`` with its fake, the eager plan cache, the reference route and the checks of
the call. Inference only."""

from __future__ import annotations

import torch

from triton_dispatch.declaration import Call, OpDeclaration, TensorSpec

from .reference import swiglu_fp8_reference, swiglu_reference


def _plan(call: Call):
    if call["gate_up"].numel() == 0:
        return None
    from .kernels import swiglu_plan  # Triton is imported once a kernel is planned

    return swiglu_plan(call)


def _plan_fp8(call: Call):
    if call["gate_up"].numel() == 0:
        return None
    from .kernels import swiglu_fp8_plan

    return swiglu_fp8_plan(call)


def _fp8_fake(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (*gate_up.shape[:-1], gate_up.shape[-1] // 2)
    return (torch.empty(shape, device=gate_up.device, dtype=torch.float8_e4m3fn),
            torch.empty(shape[:-1], device=gate_up.device, dtype=torch.float32))  # fmt: skip


def _even_last(shape: torch.Size) -> bool:
    return len(shape) >= 1 and shape[-1] % 2 == 0


_GATE_UP = TensorSpec("gate_up", (torch.float16, torch.bfloat16, torch.float32, torch.float64),
                      "(..., 2I)", fits=_even_last, contiguous=True, differentiable=False)  # fmt: skip

SWIGLU = OpDeclaration(
    "stream_dit::swiglu",
    inputs=[_GATE_UP],
    outputs=("out",),
    returns=("out",),
    reference=swiglu_reference,
    plan=_plan,
    fake=lambda gate_up: gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2)),
)  # fmt: skip

SWIGLU_FP8 = OpDeclaration(
    "stream_dit::swiglu_fp8",
    inputs=[_GATE_UP],
    outputs=("out_q", "out_scale"),
    returns=("out_q", "out_scale"),
    reference=swiglu_fp8_reference,
    plan=_plan_fp8,
    fake=_fp8_fake,
)
