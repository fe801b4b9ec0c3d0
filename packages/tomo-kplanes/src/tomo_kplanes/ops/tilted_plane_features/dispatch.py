"""``tilted_plane_features``: the public function over the declared op."""

from __future__ import annotations

import torch

from .op import TILTED_PLANE_FEATURES


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
    return TILTED_PLANE_FEATURES(points, rotations, planes, backend=backend)
