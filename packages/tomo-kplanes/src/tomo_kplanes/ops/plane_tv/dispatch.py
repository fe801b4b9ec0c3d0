"""``plane_tv``: the public function over the declared op."""

from __future__ import annotations

import torch

from .op import PLANE_TV


def plane_tv(planes: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """``mean((p[..., 1:, :] − p[..., :-1, :])²) + mean((p[..., :, 1:] − p[..., :, :-1])²)``.

    Args:
        planes: ``(..., H, W)`` float32 or float64 planes with ``H, W >= 2`` (the model passes its
            ``(3T, C, H, W)`` parameters, contiguous or channels-last).
        backend: ``"auto"`` (default), ``"triton"``, ``"interpret"`` or ``"torch"``.

    Returns:
        A 0-d tensor in the planes' dtype, differentiable w.r.t. ``planes``; its gradient has the
        planes' strides.

    Raises:
        TypeError: not a float32/float64 tensor.
        ValueError: fewer than two dimensions, or ``H`` or ``W`` below 2.
    """
    return PLANE_TV(planes, backend=backend)
