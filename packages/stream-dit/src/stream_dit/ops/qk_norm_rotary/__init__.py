"""Per-head RMS norm of queries and keys with the rotary embedding, in place on a fused QKV
projection (ACE-Step's ``norm_q``/``norm_k`` then RoPE). The declaration in :mod:`.op`, the
kernel in :mod:`.kernels`, the spec in :mod:`.reference`."""

from __future__ import annotations

import torch

from .op import QK_NORM_ROTARY
from .reference import qk_norm_rotary_reference_, rotary_tables


def qk_norm_rotary_(
    x: torch.Tensor,
    weight_q: torch.Tensor,
    weight_k: torch.Tensor,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    *,
    q_heads: int,
    k_heads: int,
    eps: float = 1e-6,
    backend: str | None = None,
) -> torch.Tensor:
    """In place: the first ``q_heads`` heads of each token of ``x`` normalised with ``weight_q``,
    the next ``k_heads`` with ``weight_k``, both rotated by ``(cos, sin)`` at the token's position
    (no rotation without tables); the columns after them (values) are left alone.

    Args:
        x: ``(B, N, W)`` contiguous float tensor, ``W >= (q_heads + k_heads)·head_dim``.
        weight_q, weight_k: ``(head_dim,)`` the norms' weights; ``head_dim`` a power of two.
        cos, sin: optional ``(>= N, head_dim)`` float32 tables (:func:`.rotary_tables`).
        q_heads, k_heads: how many heads of each kind lead the row.
        eps: the norms' epsilon.
        backend: see :func:`triton_dispatch.select_backend`.

    Returns:
        ``x``.

    Raises:
        ValueError / TypeError: naming the argument, for bad shapes, dtypes or counts.
    """
    QK_NORM_ROTARY(x, weight_q, weight_k, cos, sin, q_heads=q_heads, k_heads=k_heads, eps=eps,
                   backend=backend)  # fmt: skip
    return x


__all__ = ["qk_norm_rotary_", "qk_norm_rotary_reference_", "rotary_tables"]
