"""Guidance and latent-correction math on one row's ``(T, C)`` tensors (or batches ``(..., T, C)``).

These run per slot inside the tick; the plain-CFG + Euler case of many rows at once goes through
the fused kernel in :mod:`stream_dit.ops.guided_euler` instead.
"""

from __future__ import annotations

import math

import torch

_ROW_DIMS = (-2, -1)


def cfg_combine(v_pos: torch.Tensor, v_neg: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance ``v_neg + scale·(v_pos − v_neg)``."""
    return v_neg + scale * (v_pos - v_neg)


def cfg_rescale(v_cfg: torch.Tensor, v_pos: torch.Tensor, phi: float) -> torch.Tensor:
    """Blend ``v_cfg`` with itself rescaled to ``v_pos``'s standard deviation (Lin et al. 2023)."""
    if phi == 0.0:
        return v_cfg
    std_pos = v_pos.std(dim=_ROW_DIMS, keepdim=True)
    std_cfg = v_cfg.std(dim=_ROW_DIMS, keepdim=True).clamp_min(1e-12)
    return phi * (v_cfg * (std_pos / std_cfg)) + (1.0 - phi) * v_cfg


def apg(
    v_pos: torch.Tensor,
    v_neg: torch.Tensor,
    scale: float,
    running: torch.Tensor | None,
    *,
    momentum: float = -0.5,
    norm_threshold: float = 0.0,
    eta: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Adaptive projected guidance (Sadat et al. 2024) on velocities.

    The guidance direction ``v_pos − v_neg`` is smoothed by a momentum average (``running``, the
    slot's state; ``None`` on the first step), clipped to norm ``norm_threshold`` (0 disables), and
    split into its parts parallel and orthogonal to ``v_pos`` in float64; the parallel part is
    weighted by ``eta``. Returns the guided velocity and the new running average.
    """
    diff = v_pos - v_neg
    running = diff if running is None else diff + momentum * running
    diff = running
    if norm_threshold > 0.0:
        norm = torch.linalg.vector_norm(diff, dim=_ROW_DIMS, keepdim=True)
        diff = diff * (norm_threshold / norm.clamp_min(1e-12)).clamp(max=1.0)
    v0 = v_pos.double()
    v1 = diff.double()
    unit = v0 / torch.linalg.vector_norm(v0, dim=_ROW_DIMS, keepdim=True).clamp_min(1e-300)
    parallel = (v1 * unit).sum(dim=_ROW_DIMS, keepdim=True) * unit
    orthogonal = v1 - parallel
    update = (orthogonal + eta * parallel).to(v_pos.dtype)
    return v_pos + (scale - 1.0) * update, running


def residual_noise(x_t: torch.Tensor, v: torch.Tensor, t: float) -> torch.Tensor:
    """The noise implied by velocity ``v`` at ``x_t``: with ``x_t = (1−t)·x0 + t·ε`` and
    ``v = ε − x0``, ``ε = x_t + (1 − t)·v``."""
    return x_t + (1.0 - t) * v


def residual_negative(
    x_t: torch.Tensor, v_pos: torch.Tensor, t: float, noise: torch.Tensor
) -> torch.Tensor:
    """Residual-CFG stand-in for the negative velocity: ``ε_stock − x̂0`` where
    ``x̂0 = x_t − t·v_pos`` is the positive branch's clean estimate and ``ε_stock`` the slot's
    stored noise (its initial noise for RCFG "self", the negative pass's implied noise from the
    first step for RCFG "initialize")."""
    return noise - (x_t - t * v_pos)


def haar_split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One-level orthonormal Haar transform along time ``(T, C) -> (ceil(T/2), C)`` twice (odd T
    repeats the last frame)."""
    if x.shape[-2] % 2:
        x = torch.cat([x, x[..., -1:, :]], dim=-2)
    even, odd = x[..., 0::2, :], x[..., 1::2, :]
    return (even + odd) * math.sqrt(0.5), (even - odd) * math.sqrt(0.5)


def haar_merge(low: torch.Tensor, high: torch.Tensor, frames: int) -> torch.Tensor:
    even = (low + high) * math.sqrt(0.5)
    odd = (low - high) * math.sqrt(0.5)
    out = torch.stack([even, odd], dim=-2).flatten(-3, -2)
    return out[..., :frames, :]


def dcw_correct(
    x: torch.Tensor, x0: torch.Tensor, t: float, low: float, high: float
) -> torch.Tensor:
    """Nudge the low Haar band of ``x`` toward that of the clean estimate ``x0`` by ``low·t`` and
    the high band by ``high·(1 − t)``."""
    xl, xh = haar_split(x)
    cl, ch = haar_split(x0)
    xl = xl + (low * t) * (cl - xl)
    xh = xh + (high * (1.0 - t)) * (ch - xh)
    return haar_merge(xl, xh, x.shape[-2])
