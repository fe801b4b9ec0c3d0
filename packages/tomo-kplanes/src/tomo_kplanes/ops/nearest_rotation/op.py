"""``nearest_rotation``'s declaration: from it ``triton_dispatch`` derives the custom ops
``tomo_kplanes::nearest_rotation`` and ``..._backward`` (fakes and autograd included), the eager
autograd path, the plan cache, the reference route and the argument checks."""

from __future__ import annotations

import torch

from triton_dispatch.declaration import OpDeclaration, TensorSpec

from .kernel import rotation_plan
from .reference import nearest_rotation_reference

NEAREST_ROTATION = OpDeclaration(
    "tomo_kplanes::nearest_rotation",
    inputs=[
        TensorSpec(
            "matrices",
            (torch.float32, torch.float64),
            "(T, 3, 3)",
            fits=lambda shape: len(shape) == 3 and tuple(shape[1:]) == (3, 3),
        )
    ],
    # the symmetric factor is an internal by-product the backward reuses; callers never see it
    outputs=("rot", "sym"),
    returns=("rot",),
    saved=("rot", "sym"),
    reference=nearest_rotation_reference,
    plan=lambda call: rotation_plan(call["matrices"]),
    fake=lambda m: (m.new_empty(m.shape), m.new_empty(m.shape)),
    backward_fake=lambda grad, rot, sym: (rot.new_empty(rot.shape),),
    # the backward kernel reads the contiguous factors only, whatever the input's strides were
    backward_plan=lambda saved: rotation_plan(saved["rot"]),
)
