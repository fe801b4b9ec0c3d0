"""Argument checks shared by the ops: clear ValueError/TypeError messages naming the argument."""

from __future__ import annotations

import torch

FLOAT_INPUTS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def require_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def require_integer(name: str, t: torch.Tensor) -> None:
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor (int32 or int64), got {t.dtype}")


def rows_of(x):
    """``x (..., D)`` as ``(B, D)`` rows (a view where possible), after naming a bad ``x``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 2:
        return x
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (..., D)")
    return x.reshape(-1, x.shape[-1]) if x.shape[-1] else x.reshape(x.shape[:-1].numel(), 0)
