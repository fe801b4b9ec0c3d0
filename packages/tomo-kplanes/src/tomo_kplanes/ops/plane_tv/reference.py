"""The specification of ``plane_tv`` in plain PyTorch."""

from __future__ import annotations

import torch


def plane_tv_reference(planes: torch.Tensor) -> torch.Tensor:
    """Mean squared forward difference along H plus the same along W of ``(..., H, W)`` planes."""
    p = planes
    return (p[..., 1:, :] - p[..., :-1, :]).square().mean() + (
        p[..., :, 1:] - p[..., :, :-1]
    ).square().mean()
