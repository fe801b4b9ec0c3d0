"""ACE-Step 1.5's DiT forward on the package's fused ops: the same arithmetic as diffusers'
``AceStepTransformerBlock`` stack (the adapter's reference forward), with the non-GEMM work of
each block in three kinds of kernels and the projections batched into fewer, larger GEMMs.

Per block, against diffusers' forward:

* the query, key and value projections are one GEMM against their stacked weights, and the gate
  and up projections of the MLP another (the modules' weights become views of the stacked
  tensors, so the model holds each weight once and the reference forward still runs);
* the per-head RMS norms of queries and keys and the rotary embedding run in place on the QKV
  GEMM's output (:func:`~stream_dit.ops.qk_norm_rotary.qk_norm_rotary_`); the cross-attention's
  query and key norms run inside the attention kernel, as it loads them, and every block's
  cross-attention keys and values come from one GEMM per forward;
* each gated residual add runs with the next sublayer's RMS norm and AdaLN modulation in one pass
  (:func:`~stream_dit.ops.adaln_norm.adaln_rms_norm`): three launches per block, the last one
  already the next block's (or the output's) norm;
* the SwiGLU gate is one pass over the gate/up GEMM's output (:func:`~stream_dit.ops.swiglu`);
* the AdaLN tables of every block are added to the timestep projection in one op, the rotary
  tables are kept per sequence length, and the patchify convolution and its transpose run as
  GEMMs over contiguous patches.

* attention is one flash-attention kernel per sublayer (:func:`~stream_dit.ops.attention`)
  that reads queries, keys and values in place from the fused projections, takes padding as a
  ``(B, N)`` key mask and skips the key blocks outside the sliding window: no dense
  ``(B, 1, N, N)`` mask is built, and a padded batch runs as fast as a full one;
* the cross-attention of long rows (:attr:`FusedAceStep.fold_cross_values`) writes its softmax
  weights over the few conditioning tokens (:func:`~stream_dit.ops.attention_weights`) and
  multiplies them by the values already taken through each head's slice of the output
  projection (:func:`~stream_dit.ops.head_values`): with 64 tokens and heads of 128 the output
  projection does half the multiply-adds (:func:`folds_cross_values`), and without a bias the
  residual joins that product in place (``hidden += weights @ values``, one pass over the
  tokens fewer than writing the attention's output and adding it in the norm).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.adaln_norm import (
    adaln_rms_norm,
    adaln_rms_norm_fp8,
    rms_norm_modulate,
    rms_norm_modulate_fp8,
)
from ..ops.attention import attention
from ..ops.attention_weights import attention_weights
from ..ops.fp8_linear import fp8_linear, quantize_rows
from ..ops.head_values import head_values
from ..ops.qk_norm_rotary import qk_norm_rotary_, rotary_tables
from ..ops.swiglu import swiglu, swiglu_fp8

#: ``0`` turns :attr:`FusedAceStep.fold_cross_values` off (on by default).
FOLD_ENV_VAR = "STREAM_DIT_FOLD_CROSS_VALUES"
#: ``1`` turns :attr:`FusedAceStep.fp8` on (off by default).
FP8_ENV_VAR = "STREAM_DIT_FP8"


@dataclass
class _BlockWeights:
    qkv: torch.Tensor  # (H·d + 2·Hkv·d, D): to_q, to_k, to_v stacked
    qkv_bias: torch.Tensor | None
    gate_up: torch.Tensor  # (2·I, D): the MLP's gate and up projections stacked


def _stack_into_views(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One tensor holding the linears' weights stacked along outputs; each linear's weight (and
    bias) becomes a view of it, so the memory is held once."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    biases = [lin.bias for lin in linears]
    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = nn.Parameter(weight[start : start + rows], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[start : start + rows], requires_grad=False)
        start += rows
    return weight, bias


class FusedAceStep:
    """The prepared weights and per-length tables of one ``AceStepTransformer1DModel``, and its
    fused forward (:meth:`blocks`). Built by the adapter on first use; :meth:`stale` tells when
    the model's weights moved (a ``.to()``) and it must be built again."""

    def __init__(self, transformer: nn.Module) -> None:
        m = transformer
        self.transformer = m
        self.blocks_weights: list[_BlockWeights] = []
        self._stacks: list[tuple[torch.Tensor, list[nn.Linear]]] = []  # (stacked, its views)
        for layer in m.layers:
            sa, mlp = layer.self_attn, layer.mlp
            groups = ([sa.to_q, sa.to_k, sa.to_v], [mlp.gate_proj, mlp.up_proj])
            (qkv, qkv_b), (gu, _) = (_stack_into_views(g) for g in groups)
            self._stacks += [(qkv, groups[0]), (gu, groups[1])]
            self.blocks_weights.append(_BlockWeights(qkv, qkv_b, gu))
        # every block's cross-attention keys and values come from the same conditioning: one
        # GEMM per forward against all blocks' to_k, to_v stacked
        cross = [
            lin for layer in m.layers for lin in (layer.cross_attn.to_k, layer.cross_attn.to_v)
        ]
        self.cross_kv, self.cross_kv_bias = _stack_into_views(cross)
        self._stacks.append((self.cross_kv, cross))
        # a .to(), a checkpoint loaded into new tensors or a reassignment moves a weight off its
        # view; a load in place keeps it (the stacked tensor sees the new values)
        self._pointers = self._weight_pointers()
        self._rotary: dict = {}
        #: Run long rows' cross-attention as weights times values through the output projection
        #: (:func:`folds_cross_values`); ``STREAM_DIT_FOLD_CROSS_VALUES=0`` turns it off.
        self.fold_cross_values = os.environ.get(FOLD_ENV_VAR, "1").strip() != "0"
        #: Run the projections that read a normed or gated row (QKV, cross-attention queries,
        #: gate/up, down) as float8 e4m3 GEMMs with a scale per token and per output channel:
        #: the norms and the SwiGLU gate write their rows quantized, the weights are quantized
        #: once. On CUDA it takes bfloat16 models; ``STREAM_DIT_FP8=1`` turns it on.
        self.fp8 = os.environ.get(FP8_ENV_VAR, "0").strip() == "1"
        self._fp8_weights: dict[int, tuple[int, torch.Tensor, torch.Tensor]] = {}

    def _weight_pointers(self) -> tuple[int, ...]:
        return tuple(lin.weight.data_ptr() for _, group in self._stacks for lin in group)

    def stale(self) -> bool:
        """Whether the model's weights are no longer the views this build made."""
        return self._weight_pointers() != self._pointers

    def fp8_weight(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``weight`` ``(N, K)`` as float8 e4m3 rows and their scales ``(N,)``, quantized once and
        again, into the same tensors, after an in-place change of the weight (a captured CUDA
        graph keeps reading them)."""
        key = weight.data_ptr()
        entry = self._fp8_weights.get(key)
        version = weight._version
        if entry is None:
            q, scale = quantize_rows(weight.detach())
            self._fp8_weights[key] = (version, q, scale)
            return q, scale
        seen, q, scale = entry
        if seen != version:
            new_q, new_scale = quantize_rows(weight.detach())
            q.copy_(new_q)
            scale.copy_(new_scale)
            self._fp8_weights[key] = (version, q, scale)
        return q, scale

    def rotary(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 ``(cos, sin)`` tables for ``n`` tokens, kept per length."""
        key = (n, device)
        if key not in self._rotary:
            m = self.transformer
            if len(self._rotary) > 16:
                self._rotary.pop(next(iter(self._rotary)))
            self._rotary[key] = rotary_tables(n, m.head_dim, m.rope_theta, device)
        return self._rotary[key]

    def patchify(self, hidden: torch.Tensor) -> torch.Tensor:
        """``proj_in_conv`` over ``(B, T, C_in)`` frames (T a multiple of the patch) as one GEMM
        over contiguous patches: ``(B, T/p, D)``. The small input is reordered to the
        convolution weight's ``(C_in, p)`` order, so the weight is used as it is held."""
        conv = self.transformer.proj_in_conv
        b, frames, c = hidden.shape
        p = conv.stride[0]
        patches = hidden.reshape(b, frames // p, p, c).transpose(2, 3).reshape(b, frames // p, -1)
        return F.linear(patches, conv.weight.view(conv.out_channels, -1), conv.bias)

    def unpatchify(self, hidden: torch.Tensor) -> torch.Tensor:
        """``proj_out_conv`` (transposed, stride = kernel = p) as one GEMM against its weight
        ``(D, C_out·p)``: ``(B, N·p, C_out)`` float32."""
        conv = self.transformer.proj_out_conv
        b, n, _ = hidden.shape
        p = conv.stride[0]
        out = hidden @ conv.weight.view(conv.in_channels, -1)  # (B, N, C_out·p), c·p + j
        out = out.view(b, n, -1, p).transpose(2, 3).float()
        if conv.bias is not None:
            out = out + conv.bias.float()
        return out.reshape(b, n * p, -1)

    def blocks(
        self,
        hidden: torch.Tensor,
        timestep_proj: torch.Tensor,
        temb: torch.Tensor,
        encoder: torch.Tensor,
        key_mask: torch.Tensor | None,
        encoder_mask: torch.Tensor,
        conditioned_rows: int | None = None,
    ) -> torch.Tensor:
        """Every block and the output norm: ``(B, N, D)`` tokens in (``key_mask`` ``(B, N)``
        bool marks the real ones, ``None``: all), the output norm's modulated ``(B, N, D)`` out
        (ready for :meth:`unpatchify`). ``encoder`` ``(B, L, D)`` with ``encoder_mask`` ``(B, L)``
        bool are the embedded conditioning tokens.

        ``conditioned_rows``: the rows from this index on have one valid conditioning token, the
        first (the null condition of CFG's unconditional rows and of padded rows). Their
        cross-attention is then that token's value through the output projection for every
        query (a softmax over one key is 1): they skip the query projection and the attention.
        ``None``: every row runs them."""
        m = self.transformer
        rows, n = hidden.shape[:2]
        split = rows if conditioned_rows is None else max(0, min(int(conditioned_rows), rows))
        layers = m.layers
        first = layers[0].self_attn
        heads, kv_heads, d = first.heads, first.kv_heads, first.head_dim
        cos, sin = self.rotary(n, hidden.device)
        # (B, L, 6, D): shift, scale, gate of self-attention, then of the MLP, per block
        tables = torch.cat([layer.scale_shift_table for layer in layers])
        mods = tables + timestep_proj[:, None]
        out_shift, out_scale = (m.scale_shift_table + temb.unsqueeze(1)).unbind(1)
        # (B, L, blocks, 2·Hkv·d): each block's keys then values of the conditioning tokens;
        # the rows after the split need their first token's alone (the same GEMM: its weight
        # is read once)
        length = encoder.shape[1]
        tokens = encoder[:split].flatten(0, 1)
        if split < rows:
            tokens = torch.cat([tokens, encoder[split:, 0]])
        kv = F.linear(tokens, self.cross_kv, self.cross_kv_bias)
        cross_kv = kv[: split * length].view(split, length, len(layers), kv.shape[-1] // len(layers))
        null_kv = kv[split * length :].view(rows - split, len(layers), 2, kv_heads, d)
        # torch.compile traces the bfloat16 path (the quantized weights are kept by identity)
        fp8 = (
            self.fp8
            and (hidden.dtype == torch.bfloat16 or not hidden.is_cuda)
            and not torch.compiler.is_compiling()
        )

        def norm(x, weight, delta=None, *, to_fp8=fp8, **kw):
            """``(residual, normed)``; ``normed`` a ``(q, scale)`` pair on the FP8 path."""
            if delta is None:
                return x, (rms_norm_modulate_fp8 if to_fp8 else rms_norm_modulate)(x, weight, **kw)
            if not to_fp8:
                return adaln_rms_norm(x, weight, delta, **kw)
            residual, q, scale = adaln_rms_norm_fp8(x, weight, delta, **kw)
            return residual, (q, scale)

        def linear(normed, weight, bias=None):
            if not isinstance(normed, tuple):
                return F.linear(normed, weight, bias)
            weight_q, weight_scale = self.fp8_weight(weight)
            return fp8_linear(*normed, weight_q, weight_scale, bias, out_dtype=hidden.dtype)

        first_norm = layers[0].self_attn_norm
        _, normed = norm(hidden, first_norm.weight, scale=mods[:, 0, 1], shift=mods[:, 0, 0],
                         eps=first_norm.eps)  # fmt: skip
        for i, (layer, w) in enumerate(zip(layers, self.blocks_weights)):
            sa, ca = layer.self_attn, layer.cross_attn
            qkv = linear(normed, w.qkv, w.qkv_bias)
            qk_norm_rotary_(qkv, sa.norm_q.weight, sa.norm_k.weight, cos, sin, q_heads=heads,
                            k_heads=kv_heads, eps=sa.norm_q.eps)  # fmt: skip
            q, k, v = _heads(qkv, (heads, kv_heads, kv_heads), d)
            window = -1 if sa.sliding_window is None else int(sa.sliding_window)
            attn = attention(q, k, v, key_mask, scale=sa.scaling, window=window)
            attn = sa.to_out[0](attn.flatten(2))
            hidden, normed = norm(hidden, layer.cross_attn_norm.weight, attn, gate=mods[:, i, 2],
                                  eps=layer.cross_attn_norm.eps)  # fmt: skip

            out_proj = ca.to_out[0]
            # hidden is this block's own tensor (the norm's output): residuals add in place
            if split < rows:
                null_values = null_kv[:, i, 1].repeat_interleave(heads // kv_heads, dim=1)
                hidden[split:] += out_proj(null_values.flatten(1))[:, None]
            delta = None  # the leading rows' cross-attention output, where not added yet
            if split > 0:
                (cq,) = _heads(linear(_leading(normed, split), ca.to_q.weight, ca.to_q.bias),
                               (heads,), d)  # fmt: skip
                ck, cv = _heads(cross_kv[:, :, i], (kv_heads, kv_heads), d)
                norms = dict(q_weight=ca.norm_q.weight, k_weight=ca.norm_k.weight,
                             eps=ca.norm_q.eps)  # fmt: skip
                mask = encoder_mask[:split]
                if self.fold_cross_values and folds_cross_values(n, ck.shape[1], d):
                    weights = attention_weights(cq, ck, mask, scale=ca.scaling, **norms)
                    values = head_values(cv, out_proj.weight, heads=heads)
                    if out_proj.bias is None:
                        hidden[:split].baddbmm_(weights.flatten(2), values)
                    else:
                        delta = torch.baddbmm(out_proj.bias, weights.flatten(2), values)
                else:
                    attn = attention(cq, ck, cv, mask, scale=ca.scaling, **norms)
                    delta = out_proj(attn.flatten(2))
            if delta is not None and split < rows:  # the norm's add would cover every row
                hidden[:split] += delta
                delta = None
            mlp_norm = dict(scale=mods[:, i, 4], shift=mods[:, i, 3], eps=layer.mlp_norm.eps)
            if delta is None:
                _, normed = norm(hidden, layer.mlp_norm.weight, **mlp_norm)
            else:
                hidden, normed = norm(hidden, layer.mlp_norm.weight, delta, **mlp_norm)

            down = layer.mlp.down_proj
            gate_up = linear(normed, w.gate_up)
            if fp8:
                ff = linear(swiglu_fp8(gate_up), down.weight, down.bias)
            else:
                ff = down(swiglu(gate_up))
            last = i + 1 == len(layers)
            if not last:
                nxt = layers[i + 1].self_attn_norm
                scale, shift = mods[:, i + 1, 1], mods[:, i + 1, 0]
            else:  # the output norm feeds the unpatchify product: full precision
                nxt, scale, shift = m.norm_out, out_scale, out_shift
            hidden, normed = norm(hidden, nxt.weight, ff, gate=mods[:, i, 5], scale=scale,
                                  shift=shift, eps=nxt.eps, to_fp8=fp8 and not last)  # fmt: skip
        return normed


def folds_cross_values(queries: int, keys: int, head_dim: int) -> bool:
    """Whether the cross-attention of ``queries`` tokens per row to ``keys`` conditioning tokens
    runs as ``weights @ (values through each head's slice of the output projection)``
    (:func:`~stream_dit.ops.head_values.head_values`) instead of ``(weights @ values) @ W``.
    Per row and head the first costs ``N·M·D + M·d·D`` multiply-adds, the second ``N·d·D``: it
    is taken where it saves at least half of the values' share, ``N·(d − M) >= 2·M·d`` (ACE-Step
    1.5: 64 conditioning tokens, heads of 128, from 256 latent tokens; the output projection of
    a 60 s row then does half its work)."""
    return keys < head_dim and queries * (head_dim - keys) >= 2 * keys * head_dim


def _leading(normed, rows: int):
    """The first ``rows`` rows of a norm's output (a tensor, or the FP8 ``(q, scale)`` pair)."""
    if isinstance(normed, tuple):
        return tuple(part[:rows] for part in normed)
    return normed[:rows]


def _heads(x: torch.Tensor, counts: tuple[int, ...], d: int) -> list[torch.Tensor]:
    """``(B, N, H·d)`` views of a fused projection's columns as ``(B, N, H, d)`` per part."""
    return [
        part.unflatten(-1, (c, d)) for part, c in zip(x.split([c * d for c in counts], -1), counts)
    ]
