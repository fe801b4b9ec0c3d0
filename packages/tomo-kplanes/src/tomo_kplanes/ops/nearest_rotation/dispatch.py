"""``nearest_rotation``: the public function over the declared op."""

from __future__ import annotations

import torch

from .op import NEAREST_ROTATION


def nearest_rotation(matrices: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """The nearest rotation (Frobenius norm) to each ``(..., 3, 3)`` matrix, differentiably.

    ``R = U diag(1, 1, det(U Vᵀ)) Vᵀ`` for ``M = U S Vᵀ``; the gradient stays finite at the
    identity (it divides by ``s_i + s_j``, not ``s_i² − s_j²``). Matrices must be non-singular; one
    with a NaN or infinite entry gives an all-NaN rotation on every backend.

    Args:
        matrices: ``(..., 3, 3)`` float32 or float64.
        backend: ``"auto"`` (default), ``"triton"``, ``"interpret"`` or ``"torch"`` (SVD).

    Raises:
        TypeError: not a float32/float64 tensor.
        ValueError: the last two dimensions are not ``(3, 3)``.
    """
    if not isinstance(matrices, torch.Tensor):
        raise TypeError(f"matrices must be a torch.Tensor, got {type(matrices).__name__}")
    if matrices.dim() < 2 or matrices.shape[-2:] != (3, 3):
        raise ValueError(f"matrices must have shape (..., 3, 3), got {tuple(matrices.shape)}")
    return NEAREST_ROTATION(matrices.reshape(-1, 3, 3), backend=backend).reshape(matrices.shape)
