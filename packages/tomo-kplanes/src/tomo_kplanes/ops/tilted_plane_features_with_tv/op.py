"""``tilted_plane_features_with_tv``'s declaration: from it ``triton_dispatch`` derives the custom
ops ``tomo_kplanes::tilted_plane_features_with_tv`` and ``..._backward`` (fakes and autograd
included), the eager autograd path, the plan cache, the reference route and the argument checks."""

from __future__ import annotations

from triton_dispatch.declaration import Call, OpDeclaration

from ..plane_tv.op import PLANES
from ..tilted_plane_features.op import INPUTS, features_fake, input_grads_fake
from ..tilted_plane_features.op import check as check_features
from .plan import features_with_tv_plan
from .reference import tilted_plane_features_with_tv_reference


def _check(call: Call) -> None:
    check_features(call)
    PLANES.check(call["planes"])  # H, W >= 2, refused as plane_tv refuses them


TILTED_PLANE_FEATURES_WITH_TV = OpDeclaration(
    "tomo_kplanes::tilted_plane_features_with_tv",
    inputs=INPUTS,
    check=_check,
    outputs=("features", "tv"),
    returns=("features", "tv"),
    saved=("points", "rotations", "planes"),
    # the plans bind every stride (channels-last planes, strided points)
    keep_strides=("points", "rotations", "planes"),
    # without the points' and rotations' gradients the features' kernel skips their reductions
    backward_needs=True,
    reference=tilted_plane_features_with_tv_reference,
    plan=lambda call: features_with_tv_plan(call["points"], call["rotations"], call["planes"]),
    fake=lambda points, rotations, planes: (
        features_fake(points, rotations, planes),
        planes.new_empty(()),
    ),
    backward_fake=lambda grad_features, grad_tv, points, rotations, planes, needs: input_grads_fake(
        points, rotations, planes
    ),
)
