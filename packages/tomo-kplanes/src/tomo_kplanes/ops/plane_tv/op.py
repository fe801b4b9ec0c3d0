"""``plane_tv``'s declaration: from it ``triton_dispatch`` derives the custom ops
``tomo_kplanes::plane_tv`` and ``..._backward`` (fakes and autograd included), the eager autograd
path, the plan cache, the reference route and the argument checks."""

from __future__ import annotations

import torch

from triton_dispatch.declaration import OpDeclaration, TensorSpec

from .kernels import dense, plane_tv_plan
from .reference import plane_tv_reference

#: shared with ``tilted_plane_features_with_tv``, which refuses the planes ``plane_tv`` refuses
PLANES = TensorSpec(
    "planes",
    (torch.float32, torch.float64),
    "(..., H, W) with H, W >= 2",
    fits=lambda shape: len(shape) >= 2 and shape[-1] >= 2 and shape[-2] >= 2,
)


def _grad_fake(grad: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
    # the gradient keeps a dense layout of the planes (a channels-last parameter accumulates it
    # without a copy); a strided view's is that of the dense copy the kernels read
    stride = planes.stride() if dense(planes) else planes.new_empty(planes.shape).stride()
    return torch.empty_strided(planes.shape, stride, dtype=planes.dtype, device=planes.device)


PLANE_TV = OpDeclaration(
    "tomo_kplanes::plane_tv",
    inputs=[PLANES],
    outputs=("tv",),
    returns=("tv",),
    saved=("planes",),
    # the plan binds the planes' strides (channels-last included)
    keep_strides=("planes",),
    reference=plane_tv_reference,
    plan=lambda call: plane_tv_plan(call["planes"]),
    fake=lambda planes: planes.new_empty(()),
    backward_fake=_grad_fake,
)
