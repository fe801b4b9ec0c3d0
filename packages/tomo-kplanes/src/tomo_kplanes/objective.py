"""The object model (field + hard constraints), the TV taps fold, and the reconstruction loss.

Hard constraints act on the densities of the main ray samples only: an out-of-bounds mask (zero
outside ``[-1, 1]`` on every axis, the beam direction included), positivity and shrinkage
(soft-thresholding by ``shrinkage``). The volume-TV taps are the random points plus their forward
neighbours at step ``h = 2 / resolution`` along x, y and z; their densities stay raw (no mask, no
constraint) so taps that cross the box boundary see the field as it is. The folded path evaluates
main samples and taps in ONE field call (:meth:`TomographyObject.forward_with_tv_taps`) and hands
the tap densities to the TV loss through :class:`ReconstructionContext`; without them the loss
falls back to a second call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class DensityConstraints:
    """Hard constraints applied to the main ray samples."""

    positivity: bool = True
    shrinkage: float = 0.0
    mask_out_of_bounds: bool = True

    def apply(self, densities: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        if self.shrinkage > 0:
            densities = torch.sign(densities) * (densities.abs() - self.shrinkage).clamp_min(0.0)
        if self.positivity:
            densities = densities.clamp_min(0.0)
        if self.mask_out_of_bounds:
            inside = (points.abs() <= 1.0).all(dim=-1)
            densities = torch.where(inside, densities, torch.zeros_like(densities))
        return densities


@dataclass
class ReconstructionContext:
    """Per-step values shared between the forward pass and the loss terms."""

    tv_tap_points: torch.Tensor | None = None
    tv_tap_densities: torch.Tensor | None = None
    extras: dict = field(default_factory=dict)


class TomographyObject(nn.Module):
    """A density field on ``[-1, 1]³`` with hard constraints and volume-TV taps."""

    def __init__(
        self,
        field_model: nn.Module,
        constraints: DensityConstraints | None = None,
        *,
        tv_step: float | None = None,
    ) -> None:
        super().__init__()
        self.field = field_model
        self.constraints = constraints or DensityConstraints()
        resolution = getattr(field_model, "resolution", 64)
        self.tv_step = float(tv_step) if tv_step is not None else 2.0 / resolution

    def raw_densities(self, points: torch.Tensor) -> torch.Tensor:
        """Field densities with no mask or constraint."""
        return self.field(points)

    def densities(self, points: torch.Tensor) -> torch.Tensor:
        """Constrained densities (the two-call path's main call)."""
        return self.constraints.apply(self.field(points), points)

    forward = densities

    def sample_tv_tap_coords(
        self,
        n_points: int,
        *,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """``(4·n_points, 3)`` taps: uniform points in ``[-1, 1]³`` then their +h x/y/z neighbours
        (tap-major: all base points, then all x neighbours, …)."""
        device = device if device is not None else next(self.parameters()).device
        base = torch.rand(n_points, 3, generator=generator, device=device, dtype=dtype) * 2 - 1
        offsets = torch.eye(3, device=device, dtype=dtype) * self.tv_step
        taps = torch.cat([base.unsqueeze(0), base.unsqueeze(0) + offsets.unsqueeze(1)], dim=0)
        return taps.reshape(-1, 3)

    def forward_with_tv_taps(
        self, points: torch.Tensor, tap_points: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ONE field call on ``points`` ⧺ ``tap_points``: constrained main densities, raw taps."""
        n = points.shape[0]
        dens = self.field(torch.cat([points, tap_points.to(points.dtype)], dim=0))
        main = self.constraints.apply(dens[:n], points)
        return main, dens[n:]


def volume_tv_from_taps(tap_densities: torch.Tensor, step: float) -> torch.Tensor:
    """Isotropic TV ``mean ‖∇f‖`` from forward differences of tap densities ``(4·M,)``."""
    taps = tap_densities.reshape(4, -1)
    grad = (taps[1:] - taps[:1]) / step
    return torch.sqrt(grad.square().sum(dim=0) + 1e-12).mean()


@dataclass
class LossWeights:
    volume_tv: float = 1e-3
    plane_tv: float = 1e-4


def volume_tv_loss(obj: nn.Module, ctx: ReconstructionContext) -> torch.Tensor:
    """Volume TV from the context's folded tap densities, or (fallback) a second field call."""
    if ctx.tv_tap_densities is None:
        if ctx.tv_tap_points is None:
            raise ValueError("the context holds neither tv_tap_densities nor tv_tap_points")
        ctx.tv_tap_densities = obj.raw_densities(ctx.tv_tap_points)
    return volume_tv_from_taps(ctx.tv_tap_densities, obj.tv_step)


def reconstruction_loss(
    obj: TomographyObject,
    points: torch.Tensor,
    steps: torch.Tensor,
    target: torch.Tensor,
    weights: LossWeights,
    ctx: ReconstructionContext,
    *,
    fold_taps: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """MSE of the line integrals of ``points`` ``(B, S, 3)`` against ``target`` plus the TV terms.

    With ``fold_taps`` and tap points in ``ctx`` the taps ride along in the main field call.
    """
    flat = points.reshape(-1, 3)
    use_tv = weights.volume_tv > 0 and ctx.tv_tap_points is not None
    if use_tv and fold_taps and ctx.tv_tap_densities is None:
        dens, ctx.tv_tap_densities = obj.forward_with_tv_taps(flat, ctx.tv_tap_points)
    else:
        dens = obj.densities(flat)
    pred = dens.reshape(points.shape[:2]).sum(dim=1) * steps
    terms = {"data": (pred - target).square().mean()}
    if use_tv:
        terms["volume_tv"] = weights.volume_tv * volume_tv_loss(obj, ctx)
    if weights.plane_tv > 0 and hasattr(obj.field, "plane_tv"):
        terms["plane_tv"] = weights.plane_tv * obj.field.plane_tv()
    total = sum(terms.values())
    return total, terms
