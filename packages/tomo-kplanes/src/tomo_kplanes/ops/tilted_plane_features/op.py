"""``tilted_plane_features``' declaration: from it ``triton_dispatch`` derives the custom ops
``tomo_kplanes::tilted_plane_features`` and ``..._backward`` (fakes and autograd included), the
eager autograd path, the plan cache, the reference route and the argument checks."""

from __future__ import annotations

import torch

from triton_dispatch.declaration import Call, OpDeclaration, TensorSpec

from .backward import features_plan
from .reference import tilted_plane_features_reference

_FLOATS = (torch.float32, torch.float64)
_FLOATING = "a float32 or float64 (floating-point) tensor"

#: the arguments, shared with ``tilted_plane_features_with_tv``
INPUTS = (
    TensorSpec(
        "points", _FLOATS, "(N, 3)", fits=lambda s: len(s) == 2 and s[1] == 3,
        dtypes_expected=_FLOATING,
    ),
    TensorSpec(
        "rotations", _FLOATS, "(T, 3, 3) with T >= 1",
        fits=lambda s: len(s) == 3 and tuple(s[1:]) == (3, 3) and s[0] >= 1,
        dtypes_expected=_FLOATING,
    ),
    TensorSpec(
        "planes", _FLOATS, "(3T, C, H, W)", fits=lambda s: len(s) == 4, dtypes_expected=_FLOATING
    ),
)  # fmt: skip


def check(call: Call) -> None:
    """The planes' count against the rotations', their sizes, one dtype for all three."""
    points, rotations, planes = call["points"], call["rotations"], call["planes"]
    t = rotations.shape[0]
    if planes.shape[0] != 3 * t:
        raise ValueError(
            f"planes must have shape (3T, C, H, W) = ({3 * t}, C, H, W) for T={t} rotations, "
            f"got {tuple(planes.shape)}"
        )
    if min(planes.shape[1:]) < 1:
        raise ValueError(f"planes needs C, H, W >= 1, got {tuple(planes.shape)}")
    if not (points.dtype == rotations.dtype == planes.dtype):
        raise TypeError(
            "points, rotations and planes must share one dtype, got "
            f"{points.dtype}, {rotations.dtype}, {planes.dtype}"
        )


def features_fake(points, rotations, planes) -> torch.Tensor:
    return planes.new_empty((points.shape[0], rotations.shape[0] * planes.shape[1]))


def input_grads_fake(points, rotations, planes) -> tuple[torch.Tensor, ...]:
    return (
        points.new_empty(points.shape),
        rotations.new_empty(rotations.shape),
        torch.empty_like(planes),
    )


TILTED_PLANE_FEATURES = OpDeclaration(
    "tomo_kplanes::tilted_plane_features",
    inputs=INPUTS,
    check=check,
    outputs=("features",),
    returns=("features",),
    saved=("points", "rotations", "planes"),
    # the plans bind every stride (channels-last planes, strided points)
    keep_strides=("points", "rotations", "planes"),
    # without the points' and rotations' gradients the kernel skips their reductions
    backward_needs=True,
    reference=tilted_plane_features_reference,
    plan=lambda call: features_plan(call["points"], call["rotations"], call["planes"]),
    fake=features_fake,
    backward_fake=lambda grad, points, rotations, planes, needs: input_grads_fake(
        points, rotations, planes
    ),
)
