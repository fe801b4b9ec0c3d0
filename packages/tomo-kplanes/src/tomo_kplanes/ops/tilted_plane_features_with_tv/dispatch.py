"""``tilted_plane_features_with_tv``: the checks of both ops, where the planes' gradients can be
folded into one buffer, and the plan cache of eager calls."""

from __future__ import annotations

import torch

from triton_dispatch import uses_triton
from triton_dispatch.launch import PlanCache

from ..plane_tv import plane_tv
from ..plane_tv.dispatch import dense, kernel_path
from ..plane_tv.validation import check_planes
from ..tilted_plane_features import tilted_plane_features
from ..tilted_plane_features.dispatch import plan_key
from ..tilted_plane_features.validation import check_features
from .op import EagerFeaturesWithTV
from .reference import tilted_plane_features_with_tv_reference


def tilted_plane_features_with_tv(
    points: torch.Tensor,
    rotations: torch.Tensor,
    planes: torch.Tensor,
    *,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tilted_plane_features(points, rotations, planes), plane_tv(planes))`` as one op.

    Args and errors: those of the two ops (planes ``(3T, C, H, W)`` with ``H, W >= 2``).

    Returns:
        The ``(N, T·C)`` features and the 0-d plane TV, both differentiable; the planes' gradient
        is the sum of the two ops' gradients, made without a zero fill or an extra add.
    """
    if not torch.compiler.is_compiling():
        key = plan_key(points, rotations, planes, backend)
        if key is not None:
            plan = _PLANS.get(key, lambda: _plan(points, rotations, planes, backend))
            return plan(points, rotations, planes)
    chosen = _check(points, rotations, planes, backend)
    if not uses_triton(chosen):
        return tilted_plane_features_with_tv_reference(points, rotations, planes)
    if not _folds(planes, chosen):
        return _apart(points, rotations, planes, backend)
    return torch.ops.tomo_kplanes.tilted_plane_features_with_tv(points, rotations, planes)


_PLANS: PlanCache = PlanCache("tomo_kplanes.tilted_plane_features_with_tv")


def _check(points, rotations, planes, backend) -> str:
    chosen = check_features(points, rotations, planes, backend)
    check_planes(planes, backend)  # H, W >= 2, refused as plane_tv refuses them
    return chosen


def _folds(planes: torch.Tensor, chosen: str) -> bool:
    # both kernels read and write the planes' own dense layout: the TV's gradient is then a buffer
    # the features' backward can add into as it is
    return kernel_path(planes, chosen) and dense(planes)


def _apart(points, rotations, planes, backend):
    return (
        tilted_plane_features(points, rotations, planes, backend=backend),
        plane_tv(planes, backend=backend),
    )


def _plan(points, rotations, planes, backend):
    chosen = _check(points, rotations, planes, backend)
    if not uses_triton(chosen):
        return tilted_plane_features_with_tv_reference
    if not _folds(planes, chosen):
        return lambda points, rotations, planes: _apart(points, rotations, planes, backend)
    from ..plane_tv.kernels import plan_for
    from ..tilted_plane_features.backward import backward_plan, compile_backward_ahead
    from ..tilted_plane_features.forward import forward_plan

    forward = forward_plan(points, rotations, planes)
    backward = {need: backward_plan(points, rotations, planes, need) for need in (False, True)}
    compile_backward_ahead(backward, points, rotations, planes)
    tv = plan_for(planes)

    def run(points, rotations, planes):
        return EagerFeaturesWithTV.apply(points, rotations, planes, forward, backward, tv)

    return run
