"""The metadata checks of a nearest-code search, shared by ``quantize`` and ``residual_quantize``."""

from __future__ import annotations

from triton_dispatch import common_device, select_backend

from .._validation import require_float, require_tensor
from .reference import METRICS


def check_search(x, codebook, metric, backend, *, name: str = "codebook", stacked: bool = False):
    """The metadata checks of a nearest-code search: ``x (..., D)``, a codebook ``(K, D)`` (or with
    ``stacked`` codebooks ``(L, K, D)``) with at least one code, float dtypes, the metric, one
    device. Returns the backend; errors name the argument (the codebook as ``name``)."""
    require_tensor("x", x)
    require_tensor(name, codebook)
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (..., D)")
    shape = "(L, K, D) with L, K >= 1" if stacked else "(K, D) with K >= 1"
    if codebook.dim() != (3 if stacked else 2) or min(codebook.shape[:-1]) == 0:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(codebook.shape)}")
    if x.shape[-1] != codebook.shape[-1]:
        raise ValueError(
            f"x's last dimension ({x.shape[-1]}) must equal D of {name} ({codebook.shape[-1]})"
        )
    require_float("x", x)
    require_float(name, codebook)
    return select_backend(device=common_device([x, codebook], names=["x", name]), backend=backend)


def check_quantize(x, codebook, metric, k, backend) -> str:
    """Every metadata check of :func:`quantize`; returns the backend."""
    chosen = check_search(x, codebook, metric, backend)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= codebook.shape[0]:
        raise ValueError(f"k must be an int in [1, K={codebook.shape[0]}], got {k!r}")
    return chosen
