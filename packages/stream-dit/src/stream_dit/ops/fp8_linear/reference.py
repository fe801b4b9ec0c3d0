"""Specification of row-scaled float8 (e4m3) operands and the GEMM that reads them, in plain
PyTorch: each row (a token of the activations, an output channel of the weight) is divided by
its own scale, ``amax(|row|) / 448``, and rounded to the nearest e4m3 value, ties to even."""

from __future__ import annotations

import torch

#: The largest finite float8 e4m3 (``torch.float8_e4m3fn``) value.
E4M3_MAX = 448.0
#: The floor of a row's scale: an all-zero row quantizes to zeros with this scale.
MIN_SCALE = 1e-12


def row_scales(x: torch.Tensor) -> torch.Tensor:
    """``amax(|x|) / 448`` over the last dimension, in float32, at least :data:`MIN_SCALE`:
    ``x.shape[:-1]``."""
    amax = x.detach().to(torch.float32).abs().amax(dim=-1)
    return (amax / E4M3_MAX).clamp_min(MIN_SCALE)


def quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)``: ``q = round_e4m3(x / scale[..., None])`` (``torch.float8_e4m3fn``, ``x``'s
    shape) and ``scale`` (float32, ``x.shape[:-1]``) from :func:`row_scales`; ``q · scale``
    approximates ``x`` with a relative error of at most 2⁻⁴ per normal element."""
    scale = row_scales(x)
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    q = (x.to(work) / scale.to(work)[..., None]).clamp(-E4M3_MAX, E4M3_MAX)
    return q.to(torch.float8_e4m3fn), scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q · scale[..., None]`` in float32."""
    return q.to(torch.float32) * scale[..., None]


def fp8_linear_reference(
    q: torch.Tensor,
    q_scale: torch.Tensor,
    weight_q: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``(q·q_scale) @ (weight_q·weight_scale)ᵀ + bias`` for row-scaled operands ``q`` ``(..., K)``
    and ``weight_q`` ``(N, K)``, accumulated in float32 and rounded once to ``out_dtype``."""
    out = dequantize_rows(q, q_scale) @ dequantize_rows(weight_q, weight_scale).t()
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(out_dtype)
