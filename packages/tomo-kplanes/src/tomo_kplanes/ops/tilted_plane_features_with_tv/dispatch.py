"""``tilted_plane_features_with_tv``: the public function over the declared op."""

from __future__ import annotations

import torch

from .op import TILTED_PLANE_FEATURES_WITH_TV


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
    return TILTED_PLANE_FEATURES_WITH_TV(points, rotations, planes, backend=backend)
