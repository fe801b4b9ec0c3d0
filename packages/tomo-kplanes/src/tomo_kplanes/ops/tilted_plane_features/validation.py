"""The checks of a ``tilted_plane_features`` call (shared with ``tilted_plane_features_with_tv``):
types, shapes, one float32/float64 dtype and one device."""

from __future__ import annotations

import torch

from triton_dispatch import common_device, select_backend

_SUPPORTED_DTYPES = (torch.float32, torch.float64)


def _validate(points: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor) -> None:
    for name, t in (("points", points), ("rotations", rotations), ("planes", planes)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if points.dim() != 2 or points.shape[1] != 3:
        raise ValueError(f"points must have shape (N, 3), got {tuple(points.shape)}")
    if rotations.dim() != 3 or rotations.shape[1:] != (3, 3) or rotations.shape[0] < 1:
        raise ValueError(
            f"rotations must have shape (T, 3, 3) with T >= 1, got {tuple(rotations.shape)}"
        )
    t = rotations.shape[0]
    if planes.dim() != 4 or planes.shape[0] != 3 * t:
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
    # checked here, before the backend is chosen, so that a call is accepted or refused the same
    # way on every device and backend
    if planes.dtype not in _SUPPORTED_DTYPES:
        raise TypeError(
            f"tilted_plane_features takes float32 or float64 inputs, got {planes.dtype}; "
            "cast points, rotations and planes (e.g. .float()) first"
        )


def check_features(points, rotations, planes, backend) -> str:
    _validate(points, rotations, planes)
    device = common_device((points, rotations, planes), names=("points", "rotations", "planes"))
    return select_backend(device=device, backend=backend)
