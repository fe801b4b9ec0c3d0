"""The checks of a ``plane_tv`` call (shared with ``tilted_plane_features_with_tv``)."""

from __future__ import annotations

import torch

from triton_dispatch import common_device, select_backend

_SUPPORTED_DTYPES = (torch.float32, torch.float64)


def check_planes(planes, backend) -> str:
    if not isinstance(planes, torch.Tensor):
        raise TypeError(f"planes must be a torch.Tensor, got {type(planes).__name__}")
    if planes.dtype not in _SUPPORTED_DTYPES:
        raise TypeError(f"planes must be float32 or float64, got {planes.dtype}")
    if planes.dim() < 2 or planes.shape[-1] < 2 or planes.shape[-2] < 2:
        raise ValueError(
            f"planes must have shape (..., H, W) with H, W >= 2, got {tuple(planes.shape)}"
        )
    return select_backend(device=common_device((planes,), names=("planes",)), backend=backend)
