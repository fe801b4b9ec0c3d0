"""Gated residual add, RMS norm and AdaLN modulation in one pass: the step between two sublayers
of an AdaLN transformer block (ACE-Step's ``hidden + gate·branch`` then ``norm(hidden)·(1 +
scale) + shift``). The declarations in :mod:`.op`, the kernel in :mod:`.kernels`, the spec in
:mod:`.reference`."""

from __future__ import annotations

import torch

from .op import ADALN_RMS_NORM, ADALN_RMS_NORM_FP8, RMS_NORM_MODULATE, RMS_NORM_MODULATE_FP8
from .reference import (
    adaln_rms_norm_fp8_reference,
    adaln_rms_norm_reference,
    rms_norm_modulate_fp8_reference,
    rms_norm_modulate_reference,
)


def adaln_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    delta: torch.Tensor,
    *,
    gate: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    eps: float = 1e-6,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(residual, normed)`` with ``residual = x + gate·delta`` and ``normed =
    rms_norm(residual)·weight·(1 + scale) + shift``, reading ``x`` and ``delta`` once (exact rules:
    :func:`~.reference.adaln_rms_norm_reference`).

    Args:
        x: ``(B, N, D)`` contiguous float tensor (the residual stream).
        weight: ``(D,)`` the norm's weight.
        delta: ``(B, N, D)`` branch output added to ``x`` (same dtype, contiguous).
        gate: optional ``(B, D)`` per-row gate of ``delta`` (plain add without it).
        scale, shift: optional ``(B, D)`` AdaLN modulation (both or neither), unit stride on D.
        eps: the norm's epsilon.
        backend: see :func:`triton_dispatch.select_backend`.

    Raises:
        ValueError / TypeError: naming the argument, for bad shapes, dtypes or layouts.
    """
    return ADALN_RMS_NORM(x, weight, delta, gate, scale, shift, eps=eps, backend=backend)


def rms_norm_modulate(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    eps: float = 1e-6,
    backend: str | None = None,
) -> torch.Tensor:
    """``rms_norm(x)·weight·(1 + scale) + shift`` in one pass: :func:`adaln_rms_norm` without a
    residual branch (same arguments)."""
    return RMS_NORM_MODULATE(x, weight, scale, shift, eps=eps, backend=backend)


def adaln_rms_norm_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    delta: torch.Tensor,
    *,
    gate: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    eps: float = 1e-6,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(residual, normed_q, normed_scale)``: :func:`adaln_rms_norm` whose normed rows leave as
    ``torch.float8_e4m3fn`` ``(B, N, D)`` with a float32 scale per row ``(B, N)``
    (``amax / 448``, values rounded to nearest, ties to even), the operand of
    :func:`~stream_dit.ops.fp8_linear.fp8_linear`; same arguments and errors."""
    return ADALN_RMS_NORM_FP8(x, weight, delta, gate, scale, shift, eps=eps, backend=backend)


def rms_norm_modulate_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    eps: float = 1e-6,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(normed_q, normed_scale)``: :func:`rms_norm_modulate` leaving as float8 rows and their
    scales (see :func:`adaln_rms_norm_fp8`)."""
    return RMS_NORM_MODULATE_FP8(x, weight, scale, shift, eps=eps, backend=backend)


__all__ = [
    "adaln_rms_norm",
    "adaln_rms_norm_fp8",
    "adaln_rms_norm_fp8_reference",
    "adaln_rms_norm_reference",
    "rms_norm_modulate",
    "rms_norm_modulate_fp8",
    "rms_norm_modulate_fp8_reference",
    "rms_norm_modulate_reference",
]
