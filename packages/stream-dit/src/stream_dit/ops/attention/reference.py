"""Specification of multi-head attention with grouped key/value heads, a key-padding mask and an
optional symmetric sliding window, in plain PyTorch."""

from __future__ import annotations

import torch


def attention_probabilities(
    q: torch.Tensor,
    k: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    *,
    scale: float,
    window: int = -1,
    eps: float = 1e-6,
) -> torch.Tensor:
    """The softmax probabilities of :func:`attention_reference`, ``(B, H, N, M)`` in float32
    (float64 for float64 inputs): zeros for a query with no key to attend."""
    work = torch.float64 if q.dtype == torch.float64 else torch.float32

    def normed(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        if weight is None:
            return x
        xf = x.to(work)
        return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.to(work)).to(
            x.dtype
        )

    q, k = normed(q, q_weight), normed(k, k_weight)
    group = q.shape[2] // k.shape[2]
    qf = q.to(work).transpose(1, 2)  # (B, H, N, d)
    kf = k.to(work).transpose(1, 2).repeat_interleave(group, dim=1)
    scores = qf @ kf.transpose(-1, -2) * scale  # (B, H, N, M)
    n, m = q.shape[1], k.shape[1]
    valid = torch.ones(1, 1, n, m, dtype=torch.bool, device=q.device)
    if window >= 0:
        i = torch.arange(n, device=q.device)[:, None]
        j = torch.arange(m, device=q.device)[None, :]
        valid = valid & ((i - j).abs() <= window)
    if key_mask is not None:
        valid = valid & key_mask.to(torch.bool)[:, None, None, :]
    scores = scores.masked_fill(~valid, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.where(valid.any(-1, keepdim=True), probs, torch.zeros_like(probs))


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    *,
    scale: float,
    window: int = -1,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``softmax(scale·q·kᵀ + mask)·v`` per head, ``(B, N, H, d)``.

    ``q`` is ``(B, N, H, d)``, ``k`` and ``v`` ``(B, M, Hkv, d)`` with ``H`` a multiple of
    ``Hkv`` (query head ``h`` reads key/value head ``h // (H / Hkv)``). Query ``i`` attends key
    ``j`` when ``key_mask[b, j]`` is true (all keys without a mask) and, for ``window >= 0``,
    ``|i − j| <= window``. A query with no key to attend gets zeros. With ``q_weight`` ``(d,)``
    each query head is first RMS-normalised and scaled by it (``q·w/sqrt(mean(q²) + eps)``,
    rounded to ``q``'s dtype: the query norm of QK-norm attention); ``k_weight`` does the same to
    each key head. Computed in float32 (float64 for float64 inputs), rounded once to ``q``'s
    dtype.
    """
    probs = attention_probabilities(q, k, key_mask, q_weight, k_weight, scale=scale,
                                    window=window, eps=eps)  # fmt: skip
    group = q.shape[2] // k.shape[2]
    vf = v.to(probs.dtype).transpose(1, 2).repeat_interleave(group, dim=1)
    return (probs @ vf).transpose(1, 2).to(q.dtype)
