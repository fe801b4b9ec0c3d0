"""Reconstruction quality: PSNR and (3D, Gaussian-window) SSIM against a ground truth."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._checks import real_tensor, same_layout


def _pair(truth, estimate, ranks=(1, 2, 3), layout="(2D or 3D array)"):
    real_tensor("truth", truth, ranks, layout)
    real_tensor("estimate", estimate, ranks, layout)
    same_layout("estimate", estimate, "truth", truth)


def psnr(truth: torch.Tensor, estimate: torch.Tensor, *, data_range: float | None = None) -> float:
    """Peak signal-to-noise ratio in dB; ``data_range`` defaults to ``truth.max() − truth.min()``."""
    _pair(truth, estimate, ranks=tuple(range(1, 9)), layout="(any non-empty array)")
    truth, estimate = truth.double(), estimate.double()
    rng = float(truth.max() - truth.min()) if data_range is None else float(data_range)
    mse = float((truth - estimate).square().mean())
    return math.inf if mse == 0 else 10.0 * math.log10(rng * rng / mse)


def _gaussian_kernel(sigma: float, truncate: float, dtype, device) -> torch.Tensor:
    radius = int(truncate * sigma + 0.5)
    x = torch.arange(-radius, radius + 1, dtype=dtype, device=device)
    k = torch.exp(-0.5 * (x / sigma) ** 2)
    return k / k.sum()


def _blur_valid(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Separable Gaussian filter over every axis of a 2D/3D array, keeping only full windows."""
    dims = x.dim()
    y = x[None, None]
    for axis in range(dims):
        shape = [1, 1] + [1] * dims
        shape[2 + axis] = k.numel()
        conv = F.conv3d if dims == 3 else F.conv2d
        y = conv(y, k.reshape(shape))
    return y[0, 0]


def ssim(
    truth: torch.Tensor,
    estimate: torch.Tensor,
    *,
    data_range: float | None = None,
    sigma: float = 1.5,
) -> float:
    """Mean structural similarity with a Gaussian window (σ = 1.5, truncated at 3.5σ), population
    statistics and the standard constants ``K1 = 0.01``, ``K2 = 0.03``, averaged over the voxels
    whose window lies inside the volume (the convention of ``skimage.metrics.structural_similarity``
    with ``gaussian_weights=True, use_sample_covariance=False``)."""
    _pair(truth, estimate, ranks=(2, 3), layout="(2D or 3D array)")
    x, y = truth.double(), estimate.double()
    rng = float(x.max() - x.min()) if data_range is None else float(data_range)
    k = _gaussian_kernel(sigma, 3.5, x.dtype, x.device)
    if min(x.shape) < k.numel():
        raise ValueError(
            f"truth and estimate need every side >= {k.numel()} for ssim, got {tuple(x.shape)}"
        )
    mx, my = _blur_valid(x, k), _blur_valid(y, k)
    vx = _blur_valid(x * x, k) - mx * mx
    vy = _blur_valid(y * y, k) - my * my
    cov = _blur_valid(x * y, k) - mx * my
    c1, c2 = (0.01 * rng) ** 2, (0.03 * rng) ** 2
    s = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return float(s.mean())
