"""The checks of a ``ray_loss`` call: types, dtypes, shapes, settings and one device."""

from __future__ import annotations

import math

import torch

from triton_dispatch import common_device, select_backend

_SUPPORTED_DTYPES = (torch.float32, torch.float64)
_NAMES = ("densities", "points", "steps", "target", "plane_tv")


def check_ray_loss(tensors, settings, backend) -> str:
    for name, t in zip(_NAMES, tensors):
        if t is None and name == "plane_tv":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be float32 or float64, got {t.dtype}")
    densities, points, steps, target, plane_tv = tensors
    if points.dim() != 3 or points.shape[2] != 3:
        raise ValueError(f"points must have shape (B, S, 3), got {tuple(points.shape)}")
    b, s = points.shape[0], points.shape[1]
    for name, t in (("steps", steps), ("target", target)):
        if t.dim() != 1 or t.shape[0] != b:
            raise ValueError(
                f"{name} must have shape (B,) = ({b},) like points, got {tuple(t.shape)}"
            )
    if densities.dim() != 1 or densities.shape[0] < b * s or (densities.shape[0] - b * s) % 4:
        raise ValueError(
            f"densities must have shape (B·S + 4·M,) with B·S = {b * s} from points, "
            f"got {tuple(densities.shape)}"
        )
    if plane_tv is not None and plane_tv.dim() != 0:
        raise ValueError(f"plane_tv must be a 0-d tensor, got shape {tuple(plane_tv.shape)}")
    dtypes = {t.dtype for t in tensors[:4]}
    if len(dtypes) != 1:
        raise TypeError(
            "densities, points, steps and target must share one dtype, got "
            + ", ".join(str(t.dtype) for t in tensors[:4])
        )
    tv_step, _, _, _, shrinkage, _ = settings
    if not all(math.isfinite(x) for x in settings if isinstance(x, float)):
        raise ValueError("tv_step, the weights and shrinkage must be finite numbers")
    if shrinkage < 0:
        raise ValueError(f"shrinkage must be >= 0, got {shrinkage}")
    if densities.shape[0] > b * s and tv_step <= 0:
        raise ValueError(f"tv_step must be > 0 when densities hold taps, got {tv_step}")
    device = common_device(tensors, names=_NAMES)
    return select_backend(device=device, backend=backend)
