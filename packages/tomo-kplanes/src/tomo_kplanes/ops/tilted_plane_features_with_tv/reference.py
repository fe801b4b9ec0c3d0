"""The specification of ``tilted_plane_features_with_tv``: the two ops' references side by side."""

from __future__ import annotations

import torch

from ..plane_tv.reference import plane_tv_reference
from ..tilted_plane_features.reference import tilted_plane_features_reference


def tilted_plane_features_with_tv_reference(
    points: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tilted_plane_features_reference(points, rotations, planes), plane_tv_reference(planes))``."""
    return tilted_plane_features_reference(points, rotations, planes), plane_tv_reference(planes)
