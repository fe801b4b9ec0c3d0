"""Stable Audio's attention on PyTorch's native SDPA, with key-padding masks taken as they come.

diffusers' ``StableAudioAttnProcessor2_0`` reshapes a mask through ``Attention.
prepare_attention_mask`` (a 2-D key mask per batch row, repeated per head), and its pipeline never
passes one. The adapter needs 4-D boolean key masks ``(B, 1, 1, S)`` broadcast over heads and
queries, so it installs this processor: the same projections, partial rotary embedding (float32,
on the first ``rotary_dim`` channels of each head, self-attention keys only) and SDPA with the
default ``1/sqrt(head_dim)`` scale; grouped KV heads go through SDPA's ``enable_gqa`` (query head
``i`` reads KV head ``i // (heads / kv_heads)``, what diffusers' ``repeat_interleave`` builds).
The parity tests hold it to diffusers' own processor.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import Attention, StableAudioAttnProcessor2_0
from diffusers.models.embeddings import apply_rotary_emb

from .diffusers_common import swapped_processors


class NativeStableAudioAttnProcessor:
    """Drop-in for ``StableAudioAttnProcessor2_0`` (3-D hidden states, no dropout: inference)."""

    def __call__(
        self,
        attn: Attention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        source = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        heads = attn.heads
        q = attn.to_q(hidden_states)
        k = attn.to_k(source)
        v = attn.to_v(source)
        head_dim = q.shape[-1] // heads
        kv_heads = k.shape[-1] // head_dim
        q = q.unflatten(-1, (heads, head_dim)).transpose(1, 2)
        k = k.unflatten(-1, (kv_heads, head_dim)).transpose(1, 2)
        v = v.unflatten(-1, (kv_heads, head_dim)).transpose(1, 2)
        if attn.norm_q is not None:
            q = attn.norm_q(q)
        if attn.norm_k is not None:
            k = attn.norm_k(k)
        if rotary_emb is not None:
            q = _partial_rotary(q, rotary_emb)
            if not attn.is_cross_attention:
                k = _partial_rotary(k, rotary_emb)
        if attention_mask is not None and attention_mask.ndim == 2:
            attention_mask = attention_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attention_mask, enable_gqa=kv_heads != heads
        )
        out = out.transpose(1, 2).flatten(2, 3).to(q.dtype)
        return attn.to_out[1](attn.to_out[0](out))


def _partial_rotary(x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` channels of each head in float32, keep the rest."""
    dim = rotary[0].shape[-1]
    rotated = apply_rotary_emb(x[..., :dim].float(), rotary, use_real=True, use_real_unbind_dim=-2)
    return torch.cat([rotated, x[..., dim:].float()], dim=-1).to(x.dtype)


def _attentions(transformer: torch.nn.Module) -> list[Attention]:
    return [m for m in transformer.modules() if isinstance(m, Attention)]


def use_native_processor(transformer: torch.nn.Module) -> int:
    """Install :class:`NativeStableAudioAttnProcessor` on every attention of ``transformer``;
    return how many it replaced."""
    processor = NativeStableAudioAttnProcessor()
    attentions = _attentions(transformer)
    for module in attentions:
        module.processor = processor
    return len(attentions)


def diffusers_processors(transformer: torch.nn.Module) -> contextlib.AbstractContextManager:
    """Run ``transformer`` with diffusers' own ``StableAudioAttnProcessor2_0`` inside the block
    (the parity oracle), restoring the installed processors after."""
    return swapped_processors(_attentions(transformer), StableAudioAttnProcessor2_0())
