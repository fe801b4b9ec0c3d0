"""Specification of the gated residual add followed by an RMS norm with AdaLN modulation, the
boundary between two sublayers of an AdaLN transformer block, in plain PyTorch."""

from __future__ import annotations

import torch

from ..fp8_linear.reference import quantize_rows_reference


def adaln_rms_norm_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    delta: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    *,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(residual, normed)`` for ``x`` ``(B, N, D)``:

    * ``residual = x + gate[:, None] · delta`` (``x + delta`` without a gate, ``x`` itself
      without a delta), rounded to ``x``'s dtype: the residual stream the next sublayer adds to;
    * ``normed = rms_norm(residual) · weight · (1 + scale[:, None]) + shift[:, None]`` (no
      modulation without ``scale``/``shift``), where ``rms_norm(r) = r / sqrt(mean(r²) + eps)``
      over the last dimension, computed in float32 (float64 for float64 inputs) and rounded once.

    ``weight`` is ``(D,)``; ``gate``, ``scale`` and ``shift`` are ``(B, D)``.
    """
    residual, normed = _residual_and_normed(x, weight, delta, gate, scale, shift, eps)
    return residual, normed.to(x.dtype)


def _residual_and_normed(x, weight, delta, gate, scale, shift, eps):
    """The rounded residual and the normed rows in the working precision (not yet rounded)."""
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    residual = x
    if delta is not None:
        step = delta.to(work) if gate is None else delta.to(work) * gate.to(work)[:, None]
        residual = (x.to(work) + step).to(x.dtype)
    r = residual.to(work)
    normed = r * torch.rsqrt(r.square().mean(-1, keepdim=True) + eps) * weight.to(work)
    if scale is not None:
        normed = normed * (1 + scale.to(work)[:, None]) + shift.to(work)[:, None]
    return residual, normed


def adaln_rms_norm_fp8_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    delta: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    *,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(residual, normed_q, normed_scale)``: :func:`adaln_rms_norm_reference` with the normed
    rows, unrounded, quantized to float8 e4m3 with one scale per row
    (:func:`~stream_dit.ops.fp8_linear.reference.quantize_rows_reference`): ``normed_q``
    ``(B, N, D)`` ``torch.float8_e4m3fn``, ``normed_scale`` ``(B, N)`` float32."""
    residual, normed = _residual_and_normed(x, weight, delta, gate, scale, shift, eps)
    q, q_scale = quantize_rows_reference(normed)
    return residual, q, q_scale


def rms_norm_modulate_fp8_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    *,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(normed_q, normed_scale)`` of :func:`adaln_rms_norm_fp8_reference` without a residual
    branch."""
    return adaln_rms_norm_fp8_reference(x, weight, None, None, scale, shift, eps=eps)[1:]


def rms_norm_modulate_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    *,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``normed`` of :func:`adaln_rms_norm_reference` without a residual branch."""
    return adaln_rms_norm_reference(x, weight, None, None, scale, shift, eps=eps)[1]
