"""FP8 quantisation of embeddings (one scale per tensor or per token) and its inverse."""

from __future__ import annotations

import torch

from .reference import dequantize, quantize


def quantize_fp8_per_tensor(
    X: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X_fp8, scale)`` with one float32 scale (shape ``()``): ``X ≈ X_fp8.float() * scale``,
    the largest ``|X|`` mapped to ``torch.finfo(dtype).max``. ``X`` must be finite (one host
    synchronisation checks it)."""
    _check_quantize_input(X)
    return quantize(X, dtype, per_token=False)


def quantize_fp8_per_token(
    X: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X_fp8, scale)`` with one float32 scale per token (row of the last axis), shape
    ``X.shape[:-1]``; ``X`` is 2-D or 3-D and finite."""
    _check_quantize_input(X)
    if X.dim() not in (2, 3):
        raise ValueError(f"X must be 2-D or 3-D, got shape {tuple(X.shape)}")
    return quantize(X, dtype, per_token=True)


def _check_quantize_input(X) -> None:
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"X must be a floating tensor, got {type(X).__name__}")
    if X.dtype not in _QUANTIZABLE:
        raise TypeError(f"X must be float16, bfloat16, float32 or float64, got {X.dtype}")
    # a NaN or inf has no scale: it would turn every value sharing its scale into NaN
    if X.numel() and not bool(torch.isfinite(X).all()):
        raise ValueError("X must be finite: it holds NaN or inf, which have no FP8 scale")


def dequantize_fp8_per_tensor(X_fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``X_fp8.float() * scale`` (float32)."""
    return dequantize(X_fp8, scale, per_token=False)


def dequantize_fp8_per_token(X_fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``X_fp8.float() * scale[..., None]`` (float32)."""
    return dequantize(X_fp8, scale, per_token=True)


_QUANTIZABLE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
