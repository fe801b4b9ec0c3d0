"""``swiglu``'s declaration: from it ``triton_dispatch`` derives the custom op
``stream_dit::swiglu`` with its fake, the eager plan cache, the reference route and the checks of
the call. Inference only."""

from __future__ import annotations

import torch

from triton_dispatch.declaration import Call, OpDeclaration, TensorSpec

from .reference import swiglu_reference


def _plan(call: Call):
    if call["gate_up"].numel() == 0:
        return None
    from .kernels import swiglu_plan  # Triton is imported once a kernel is planned

    return swiglu_plan(call)


def _even_last(shape: torch.Size) -> bool:
    return len(shape) >= 1 and shape[-1] % 2 == 0


SWIGLU = OpDeclaration(
    "stream_dit::swiglu",
    inputs=[
        TensorSpec("gate_up", (torch.float16, torch.bfloat16, torch.float32, torch.float64),
                   "(..., 2I)", fits=_even_last, contiguous=True, differentiable=False),
    ],
    outputs=("out",),
    returns=("out",),
    reference=swiglu_reference,
    plan=_plan,
    fake=lambda gate_up: gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2)),
)  # fmt: skip
