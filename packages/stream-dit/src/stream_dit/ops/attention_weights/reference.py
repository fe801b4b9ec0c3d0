"""Specification of the softmax weights of attention to a few keys, in plain PyTorch."""

from __future__ import annotations

import torch

from ..attention.reference import attention_probabilities


def attention_weights_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    *,
    scale: float,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``softmax(scale·q·kᵀ + mask)`` per head, ``(B, N, H, M)``: the weights
    :func:`~stream_dit.ops.attention.attention_reference` gives the values (same masks, query and
    key norms and grouped heads; no window), zeros for a query with no key. Computed in float32
    (float64 for float64 inputs), rounded once to ``q``'s dtype."""
    probs = attention_probabilities(q, k, key_mask, q_weight, k_weight, scale=scale, eps=eps)
    return probs.transpose(1, 2).to(q.dtype)
