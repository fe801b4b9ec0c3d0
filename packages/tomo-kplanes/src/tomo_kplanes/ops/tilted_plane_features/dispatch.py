"""``tilted_plane_features``: the backend choice and the plan cache of eager calls."""

from __future__ import annotations

import torch

from triton_dispatch import uses_triton
from triton_dispatch.launch import PlanCache, call_key

from .op import EagerFeatures
from .reference import tilted_plane_features_reference
from .validation import check_features


def tilted_plane_features(
    points: torch.Tensor,
    rotations: torch.Tensor,
    planes: torch.Tensor,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Features ``(N, T·C)`` of ``points`` sampled from ``T`` rotated triplets of feature planes.

    For each rotation ``t`` the points are rotated (``q = R_t p``), the planes ``3t`` (XY), ``3t+1``
    (ZX) and ``3t+2`` (YZ) are sampled bilinearly (``align_corners=True``, border clamping) and the
    three samples multiplied; the results are concatenated over rotations (column ``t·C + c``).

    Args:
        points: ``(N, 3)`` coordinates ``(x, y, z)`` in ``[-1, 1]`` (outside is clamped).
        rotations: ``(T, 3, 3)`` matrices (any matrices work; the model passes rotations).
        planes: ``(3T, C, H, W)`` feature planes; channels-last memory makes the kernel's channel
            reads contiguous.
        backend: ``"auto"`` (default), ``"triton"``, ``"interpret"`` or ``"torch"``.

    Returns:
        ``(N, T·C)`` in the inputs' dtype. Differentiable w.r.t. all three inputs; the gradient
        w.r.t. a coordinate is zero where the border clamp is active, as in ``grid_sample``.
        Where a rotated point ``R_t p`` has a NaN or infinite coordinate, its ``C`` features for
        rotation ``t`` are NaN and the pair adds nothing to any gradient (on every backend).

    Raises:
        TypeError: non-float, mismatched, or other than float32/float64 dtypes (on every backend).
        ValueError: wrong shapes or tensors on different devices.
    """
    if not torch.compiler.is_compiling():
        key = plan_key(points, rotations, planes, backend)
        if key is not None:
            plan = _PLANS.get(key, lambda: _plan(points, rotations, planes, backend))
            return plan(points, rotations, planes)
    if not uses_triton(check_features(points, rotations, planes, backend)):
        return tilted_plane_features_reference(points, rotations, planes)
    return torch.ops.tomo_kplanes.tilted_plane_features(points, rotations, planes)


_PLANS: PlanCache = PlanCache("tomo_kplanes.tilted_plane_features")


def plan_key(points, rotations, planes, backend):
    tensors = (points, rotations, planes)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    # the kernels' plans depend on every stride (channels-last planes are not "contiguous")
    strides = tuple(t.stride() for t in tensors)
    return call_key(tensors, strides, backend, torch.is_grad_enabled())


def _plan(points, rotations, planes, backend):
    if not uses_triton(check_features(points, rotations, planes, backend)):
        return tilted_plane_features_reference
    from .backward import backward_plan, compile_backward_ahead
    from .forward import forward_plan

    forward = forward_plan(points, rotations, planes)
    backward = {need: backward_plan(points, rotations, planes, need) for need in (False, True)}
    compile_backward_ahead(backward, points, rotations, planes)

    def run(points, rotations, planes):
        return EagerFeatures.apply(points, rotations, planes, forward, backward)

    return run
