"""Argument checks of the plain-PyTorch utilities: each error names the argument and what it
expected, before any PyTorch op can fail on it with its own message."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def real_tensor(name: str, x, ranks: Sequence[int], layout: str) -> torch.Tensor:
    """``x`` as a non-empty floating tensor of one of ``ranks`` (``layout`` describes it)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {layout}, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor {layout}, got {x.dtype}")
    if x.dim() not in ranks:
        raise ValueError(f"{name} must have shape {layout}, got {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(x.shape)}")
    if x.device.type == "meta":
        raise ValueError(f"{name} is a meta tensor (no values)")
    return x


def same_layout(name: str, x: torch.Tensor, like_name: str, like: torch.Tensor) -> None:
    """``x`` has ``like``'s shape and device."""
    if x.shape != like.shape:
        raise ValueError(
            f"{name} must have {like_name}'s shape {tuple(like.shape)}, got {tuple(x.shape)}"
        )
    if x.device != like.device:
        raise ValueError(f"{name} is on {x.device}, {like_name} on {like.device}")
