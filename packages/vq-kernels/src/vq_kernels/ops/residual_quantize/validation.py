"""The metadata checks of a ``residual_quantize`` call."""

from __future__ import annotations

import math

from ..quantize import check_search


def _check_weight(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def check_residual_quantize(
    x, codebooks, metric, commitment_weight, codebook_weight, backend
) -> str:
    """Every metadata check of :func:`residual_quantize`; returns the backend."""
    chosen = check_search(x, codebooks, metric, backend, name="codebooks", stacked=True)
    _check_weight("commitment_weight", commitment_weight)
    _check_weight("codebook_weight", codebook_weight)
    return chosen
