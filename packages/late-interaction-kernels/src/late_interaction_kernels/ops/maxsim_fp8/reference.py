"""FP8 quantisation of token embeddings and the specification of FP8 MaxSim scoring.

``X ≈ X_fp8.float() * scale`` with one float32 scale per tensor (``()``) or per token
(``X.shape[:-1]``), chosen so that the largest magnitude maps to the format's largest finite
value. Scores of quantised inputs are the MaxSim of the dequantised tokens.
"""

from __future__ import annotations

import torch

from ..maxsim.reference import maxsim_reference

#: Smallest scale numerator: an all-zero tensor still gets a positive, finite scale.
AMAX_FLOOR = 1e-6


def _fmax(dtype: torch.dtype) -> float:
    if not dtype.is_floating_point or torch.finfo(dtype).bits != 8:
        raise TypeError(f"dtype must be an 8-bit float (torch.float8_e4m3fn / e5m2), got {dtype}")
    return float(torch.finfo(dtype).max)


def quantize(X: torch.Tensor, dtype: torch.dtype, per_token: bool):
    fmax = _fmax(dtype)
    if X.numel() == 0:
        shape = X.shape[:-1] if per_token else ()
        return X.to(dtype), torch.ones(shape, dtype=torch.float32, device=X.device)
    Xf = X.detach().to(torch.float32)
    amax = Xf.abs().amax(dim=-1) if per_token else Xf.abs().amax()
    scale = amax.clamp_min(AMAX_FLOOR) / fmax
    q = (Xf / (scale.unsqueeze(-1) if per_token else scale)).clamp(-fmax, fmax).to(dtype)
    return q.contiguous(), scale


def dequantize(X_fp8: torch.Tensor, scale: torch.Tensor, per_token: bool) -> torch.Tensor:
    return X_fp8.to(torch.float32) * (scale.unsqueeze(-1) if per_token else scale)


def valid_scale(scale: torch.Tensor) -> torch.Tensor:
    """``scale`` with every entry that is negative, NaN or infinite replaced by NaN: such a scale
    has no meaning (quantisation gives finite positive scales), and the scores that use it are NaN
    whatever order the products are taken in."""
    return torch.where(torch.isfinite(scale) & (scale >= 0), scale, scale.new_tensor(float("nan")))


def maxsim_fp8_reference(
    Q, D, scale_Q, scale_D, q_mask=None, d_mask=None, *, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """``(Nq, Nd)`` MaxSim of the dequantised ``Q (Nq, Lq, d)`` and ``D (Nd, Ld, d)``; a scale is
    one element (per tensor) or ``(N, L)`` (per token), read through :func:`valid_scale`.
    Computed in ``dtype``: float64 for the tests' oracle, float32 for the PyTorch route of
    ``maxsim_inference_fp8``."""
    sq, sd = valid_scale(scale_Q.to(dtype)), valid_scale(scale_D.to(dtype))
    Qd = Q.to(dtype) * (sq[..., None] if sq.dim() else sq)
    Dd = D.to(dtype) * (sd[..., None] if sd.dim() else sd)
    return maxsim_reference(Qd, Dd, q_mask, d_mask)
