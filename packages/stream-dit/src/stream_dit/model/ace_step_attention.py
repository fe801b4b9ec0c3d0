"""ACE-Step's attention on PyTorch's native SDPA, as one traceable function.

diffusers' ``AceStepAttnProcessor2_0`` looks its backend up on every call by building an
``AttentionBackendName`` enum, which ``torch.compile`` cannot trace: each of the 48 attention calls
of a forward becomes its own compiled frame, guarded on its mask's type and shape, so a few batch
buckets exhaust dynamo's recompile limit and the engine silently falls back to eager. The adapter
installs this processor when the active backend is the native one (the default); the arithmetic is
the native backend's (projections, Q/K RMSNorm, rotary embedding on self-attention, SDPA with GQA),
and the parity tests hold it to the diffusers forward.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from diffusers.models.transformers import ace_step_transformer as _ace

from .diffusers_common import swapped_processors


class NativeAceStepAttnProcessor:
    """Drop-in for ``AceStepAttnProcessor2_0`` on the native backend (no dropout: inference)."""

    def __call__(
        self,
        attn: _ace.AceStepAttention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        cross = attn.is_cross_attention and encoder_hidden_states is not None
        source = encoder_hidden_states if cross else hidden_states
        q = attn.norm_q(attn.to_q(hidden_states).unflatten(-1, (attn.heads, attn.head_dim)))
        k = attn.norm_k(attn.to_k(source).unflatten(-1, (attn.kv_heads, attn.head_dim)))
        v = attn.to_v(source).unflatten(-1, (attn.kv_heads, attn.head_dim))
        if not cross and image_rotary_emb is not None:
            # looked up at call time: the ONNX export swaps the module's rotary function
            rotary = _ace.apply_rotary_emb
            q = rotary(q, image_rotary_emb, use_real=True, use_real_unbind_dim=-2, sequence_dim=1)
            k = rotary(k, image_rotary_emb, use_real=True, use_real_unbind_dim=-2, sequence_dim=1)
        if attention_mask is not None and attention_mask.ndim == 2:
            attention_mask = attention_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=attention_mask,
            scale=attn.scaling,
            enable_gqa=attn.heads != attn.kv_heads,
        )
        out = out.transpose(1, 2).flatten(2, 3).to(q.dtype)
        return attn.to_out[1](attn.to_out[0](out))


def use_native_processor(transformer: _ace.AceStepTransformer1DModel) -> bool:
    """Install :class:`NativeAceStepAttnProcessor` on every attention of ``transformer`` when its
    backend is the native one; return whether it did (flash backends keep diffusers' processor)."""
    attentions = [
        module for module in transformer.modules() if isinstance(module, _ace.AceStepAttention)
    ]
    if not attentions:
        return False
    backend = _ace._get_current_attention_backend(attentions[0].processor)
    if backend != _ace.AttentionBackendName.NATIVE:
        return False
    processor = NativeAceStepAttnProcessor()
    for module in attentions:
        module.processor = processor
    return True


def diffusers_processors(
    transformer: _ace.AceStepTransformer1DModel,
) -> contextlib.AbstractContextManager:
    """Run ``transformer`` with diffusers' own ``AceStepAttnProcessor2_0`` inside the block (the
    parity oracle), restoring the installed processors after."""
    attentions = [m for m in transformer.modules() if isinstance(m, _ace.AceStepAttention)]
    return swapped_processors(attentions, _ace.AceStepAttnProcessor2_0())
