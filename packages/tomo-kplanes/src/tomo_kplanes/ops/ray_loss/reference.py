"""The specification of ``ray_loss`` in plain PyTorch: the reconstruction objective as the
package has always written it (hard constraints on the main samples, mean squared error of the
line integrals, volume TV from forward-difference taps, the weighted plane TV added last)."""

from __future__ import annotations

import torch

#: added under the square root of the volume TV (a finite gradient where the field is flat)
VOLUME_TV_EPS = 1e-12


def apply_constraints(
    densities: torch.Tensor,
    points: torch.Tensor,
    *,
    positivity: bool,
    shrinkage: float,
    mask_out_of_bounds: bool,
) -> torch.Tensor:
    """Soft-thresholding by ``shrinkage`` (when > 0), then ``max(·, 0)`` (``positivity``), then zero
    where a point ``(N, 3)`` lies outside ``[-1, 1]`` on any axis (``mask_out_of_bounds``)."""
    if shrinkage > 0:
        densities = torch.sign(densities) * (densities.abs() - shrinkage).clamp_min(0.0)
    if positivity:
        densities = densities.clamp_min(0.0)
    if mask_out_of_bounds:
        inside = (points.abs() <= 1.0).all(dim=-1)
        densities = torch.where(inside, densities, torch.zeros_like(densities))
    return densities


def volume_tv_from_taps(tap_densities: torch.Tensor, step: float) -> torch.Tensor:
    """Isotropic TV ``mean ‖∇f‖`` from forward differences of tap densities ``(4·M,)``."""
    taps = tap_densities.reshape(4, -1)
    grad = (taps[1:] - taps[:1]) / step
    return torch.sqrt(grad.square().sum(dim=0) + VOLUME_TV_EPS).mean()


def ray_loss_reference(
    densities: torch.Tensor,
    points: torch.Tensor,
    steps: torch.Tensor,
    target: torch.Tensor,
    plane_tv: torch.Tensor | None = None,
    *,
    tv_step: float = 1.0,
    volume_tv_weight: float = 0.0,
    plane_tv_weight: float = 0.0,
    positivity: bool = True,
    shrinkage: float = 0.0,
    mask_out_of_bounds: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(total, terms)``; see :func:`tomo_kplanes.ops.ray_loss`."""
    b, s = points.shape[0], points.shape[1]
    n = b * s
    main = apply_constraints(
        densities[:n],
        points.reshape(-1, 3),
        positivity=positivity,
        shrinkage=shrinkage,
        mask_out_of_bounds=mask_out_of_bounds,
    )
    pred = main.reshape(b, s).sum(dim=1) * steps
    data = (pred - target).square().mean()
    zero = torch.zeros((), dtype=data.dtype, device=data.device)
    total, volume, plane = data, zero, zero
    if densities.shape[0] > n:
        volume = volume_tv_weight * volume_tv_from_taps(densities[n:], tv_step)
        total = total + volume
    if plane_tv is not None:
        plane = plane_tv_weight * plane_tv
        total = total + plane
    return total, torch.stack([data, volume, plane])
