"""Specification of the per-head RMS norm of queries and keys with the rotary embedding
(rotate-half layout, as Qwen3 and ACE-Step 1.5), applied in place to a fused projection."""

from __future__ import annotations

import torch


def rotary_tables(
    tokens: int, head_dim: int, theta: float, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` ``(tokens, head_dim)`` float32 for positions ``0..tokens-1``: frequencies
    ``theta^(-2i/head_dim)`` repeated over the two halves (diffusers'
    ``get_1d_rotary_pos_embed(..., use_real=True, repeat_interleave_real=False)``)."""
    half = head_dim // 2
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device)[:half].double() / head_dim)
    angles = torch.arange(tokens, device=device).double()[:, None] * freqs[None]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def qk_norm_rotary_reference_(
    x: torch.Tensor,
    weight_q: torch.Tensor,
    weight_k: torch.Tensor,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    *,
    q_heads: int,
    k_heads: int,
    eps: float = 1e-6,
) -> tuple:
    """In place on ``x`` ``(B, N, W)``, whose last dimension holds heads of ``head_dim =
    weight_q.numel()`` numbers: the first ``q_heads`` heads become ``rope(rms_norm(h)·weight_q)``,
    the next ``k_heads`` ``rope(rms_norm(h)·weight_k)``, the rest (values) stay as they are.
    ``rope(h) = h·cos[n] + rotate_half(h)·sin[n]`` at the token's position ``n`` (no rotation when
    ``cos`` is ``None``); computed in float32 (float64 for float64 ``x``), rounded once. Returns no
    output."""
    n = x.shape[1]
    d = weight_q.numel()
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    heads = q_heads + k_heads
    h = x[..., : heads * d].unflatten(-1, (heads, d)).to(work)
    h = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps)
    w = torch.cat([weight_q.to(work).expand(q_heads, d), weight_k.to(work).expand(k_heads, d)])
    h = h * w
    if cos is not None:
        c, s = cos.to(work)[:n, None, :], sin.to(work)[:n, None, :]
        first, second = h.chunk(2, dim=-1)
        h = h * c + torch.cat([-second, first], dim=-1) * s
    x[..., : heads * d] = h.flatten(-2).to(x.dtype)
    return ()
