"""Specification of each query head's values through its slice of the attention's output
projection, in plain PyTorch."""

from __future__ import annotations

import torch


def head_values_reference(v: torch.Tensor, weight: torch.Tensor, *, heads: int) -> torch.Tensor:
    """``out[b, h·M + m, :] = weight[:, h·d:(h+1)·d] @ v[b, m, h // (H / Hkv), :]``:
    ``(B, H·M, D_out)`` for values ``v`` ``(B, M, Hkv, d)`` and an output projection ``weight``
    ``(D_out, H·d)``. With attention weights ``p`` ``(B, N, H, M)`` of those values,
    ``p.flatten(2) @ out`` is the attention's output through the projection (without its bias).
    Computed in float32 (float64 for float64 inputs), rounded once to ``v``'s dtype."""
    work = torch.float64 if v.dtype == torch.float64 else torch.float32
    b, m, kv_heads, d = v.shape
    group = heads // kv_heads
    per_head = v.to(work).repeat_interleave(group, dim=2)  # (B, M, H, d)
    w = weight.to(work).view(weight.shape[0], heads, d)  # (D_out, H, d)
    out = torch.einsum("bmhd,nhd->bhmn", per_head, w)
    return out.reshape(b, heads * m, weight.shape[0]).to(v.dtype)
