"""GEMMs on row-scaled float8 e4m3 operands (Hopper's FP8 tensor cores through cuBLASLt, via
``torch._scaled_mm`` with a scale per token and per output channel): the activations come
quantized from the kernels that write them (the AdaLN norms, the SwiGLU gate), the weights are
quantized once. The spec in :mod:`.reference`, the shared rounding in :mod:`.kernels`."""

from __future__ import annotations

import torch

from triton_dispatch import device_facts

from .reference import (
    E4M3_MAX,
    dequantize_rows,
    fp8_linear_reference,
    quantize_rows_reference,
)

#: Sizes cuBLASLt's FP8 GEMM takes: ``K`` and ``N`` multiples of 16.
_ALIGN = 16


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)``: ``x`` ``(..., K)`` as ``torch.float8_e4m3fn`` rows and their float32
    scales ``(...,)`` (:func:`~.reference.quantize_rows_reference`); for weights, quantized
    once per output channel."""
    if not x.is_floating_point() or x.dtype == torch.float8_e4m3fn:
        raise TypeError(f"x must be a float16/bfloat16/float32/float64 tensor, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dimension (..., K), got {tuple(x.shape)}")
    return quantize_rows_reference(x)


def _check(q, q_scale, weight_q, weight_scale, bias) -> None:
    if q.dtype != torch.float8_e4m3fn:
        raise TypeError(f"q must be torch.float8_e4m3fn (..., K), got {q.dtype}")
    if weight_q.dtype != torch.float8_e4m3fn or weight_q.dim() != 2:
        raise TypeError(
            f"weight_q must be a torch.float8_e4m3fn (N, K) matrix, got {weight_q.dtype} "
            f"of shape {tuple(weight_q.shape)}"
        )
    n, k = weight_q.shape
    if q.dim() < 1 or q.shape[-1] != k:
        raise ValueError(f"q must be (..., K) with K = {k} (weight_q's), got {tuple(q.shape)}")
    if q_scale.dtype != torch.float32 or tuple(q_scale.shape) != tuple(q.shape[:-1]):
        raise ValueError(
            f"q_scale must be float32 of shape {tuple(q.shape[:-1])} (q's rows), got "
            f"{q_scale.dtype} of shape {tuple(q_scale.shape)}"
        )
    if weight_scale.dtype != torch.float32 or tuple(weight_scale.shape) != (n,):
        raise ValueError(
            f"weight_scale must be float32 of shape ({n},) (N), got {weight_scale.dtype} of "
            f"shape {tuple(weight_scale.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias must have shape ({n},) (N), got {tuple(bias.shape)}")


def _scaled_mm_fits(q: torch.Tensor, weight_q: torch.Tensor, out_dtype: torch.dtype) -> bool:
    # row-wise scales: bfloat16 outputs only
    if out_dtype != torch.bfloat16 or not q.is_cuda:
        return False
    if device_facts(q.device).capability < (8, 9):  # cached: this runs before every GEMM
        return False
    n, k = weight_q.shape
    return k % _ALIGN == 0 and n % _ALIGN == 0 and q.is_contiguous() and weight_q.is_contiguous()


def fp8_linear(
    q: torch.Tensor,
    q_scale: torch.Tensor,
    weight_q: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``(q·q_scale) @ (weight_q·weight_scale)ᵀ + bias`` ``(..., N)`` in ``out_dtype``.

    Args:
        q: ``(..., K)`` ``torch.float8_e4m3fn`` activations, one scale per row.
        q_scale: ``(...)`` float32 scales of ``q``'s rows.
        weight_q: ``(N, K)`` ``torch.float8_e4m3fn`` weight, one scale per output channel.
        weight_scale: ``(N,)`` float32 scales of ``weight_q``'s rows.
        bias: optional ``(N,)`` bias, added in the GEMM's epilogue.
        out_dtype: the output's dtype.

    On a CUDA device of compute capability 8.9 or later, with ``K`` and ``N`` multiples of 16
    and a bfloat16 output, one cuBLASLt FP8 GEMM with row-wise scales; elsewhere the float32
    reference.

    Raises:
        TypeError / ValueError: naming the argument, for bad dtypes or shapes.
    """
    _check(q, q_scale, weight_q, weight_scale, bias)
    if q.numel() == 0 or not _scaled_mm_fits(q, weight_q, out_dtype):
        return fp8_linear_reference(q, q_scale, weight_q, weight_scale, bias, out_dtype=out_dtype)
    rows = q.reshape(-1, q.shape[-1])
    out = torch._scaled_mm(
        rows,
        weight_q.t(),
        scale_a=q_scale.reshape(-1, 1),
        scale_b=weight_scale.view(1, -1),
        bias=None if bias is None else bias.to(out_dtype),
        out_dtype=out_dtype,
    )
    return out.view(*q.shape[:-1], weight_q.shape[0])


__all__ = [
    "E4M3_MAX",
    "dequantize_rows",
    "fp8_linear",
    "fp8_linear_reference",
    "quantize_rows",
    "quantize_rows_reference",
]
