"""The object model (field + hard constraints), the TV taps fold, and the reconstruction loss.

Hard constraints act on the densities of the main ray samples only: an out-of-bounds mask (zero
outside ``[-1, 1]`` on every axis, the beam direction included), positivity and shrinkage
(soft-thresholding by ``shrinkage``). The volume-TV taps are the random points plus their forward
neighbours at step ``h = 2 / resolution`` along x, y and z; their densities stay raw (no mask, no
constraint) so taps that cross the box boundary see the field as it is. The folded path evaluates
main samples and taps in ONE field call (:meth:`TomographyObject.forward_with_tv_taps`) and hands
the tap densities to the TV loss through :class:`ReconstructionContext`; without them the loss
falls back to a second call.

:func:`reconstruction_loss` evaluates everything after the field call (constraints, line
integrals, data term, volume TV, weighted sum with the plane TV) with the fused op
:func:`~tomo_kplanes.ops.ray_loss` whenever it can (one field call, the stock constraints, one
dtype): two launches forward and one backward instead of about thirty of each, the launch count
being what bounds an eager step at these sizes. ``ray_loss``'s reference is the PyTorch formulation
the other paths keep.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .ops.ray_loss import apply_constraints, ray_loss
from .ops.ray_loss import volume_tv_from_taps as volume_tv_from_taps


@dataclass
class DensityConstraints:
    """Hard constraints applied to the main ray samples."""

    positivity: bool = True
    shrinkage: float = 0.0
    mask_out_of_bounds: bool = True

    def apply(self, densities: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        return apply_constraints(
            densities,
            points,
            positivity=self.positivity,
            shrinkage=self.shrinkage,
            mask_out_of_bounds=self.mask_out_of_bounds,
        )


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
        #: (device, dtype, step) -> the (4, 1, 3) tap offsets: 0, then h along x, y and z
        self._tap_offsets: dict[tuple, torch.Tensor] = {}

    def raw_densities(
        self, points: torch.Tensor, *, with_plane_tv: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Field densities with no mask or constraint; with ``with_plane_tv``, ``(densities, plane
        TV)`` from the same field call (a field whose ``forward`` takes ``with_plane_tv``)."""
        if with_plane_tv:
            return self.field(points, with_plane_tv=True)
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
        device = torch.device(device) if device is not None else next(self.parameters()).device
        # two launches: uniform_(-1, 1) draws the same numbers as rand() * 2 - 1 (bit for bit), and
        # one broadcast add of the cached offsets writes all four taps
        base = torch.empty(1, n_points, 3, device=device, dtype=dtype)
        base.uniform_(-1.0, 1.0, generator=generator)
        return torch.add(base, self._offsets(device, dtype)).view(-1, 3)

    def _offsets(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        key = (device, dtype, self.tv_step)
        offsets = self._tap_offsets.get(key)
        if offsets is None:
            eye = torch.eye(3, dtype=dtype) * self.tv_step
            offsets = torch.cat([torch.zeros(1, 3, dtype=dtype), eye]).unsqueeze(1).to(device)
            self._tap_offsets[key] = offsets
        return offsets

    def raw_densities_with_taps(
        self, points: torch.Tensor, tap_points: torch.Tensor, *, with_plane_tv: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """ONE field call on ``points`` ⧺ ``tap_points``: raw densities ``(N + 4·M,)`` (and the
        plane TV, as in :meth:`raw_densities`)."""
        both = torch.cat([points, tap_points.to(points.dtype)], dim=0)
        return self.raw_densities(both, with_plane_tv=with_plane_tv)

    def forward_with_tv_taps(
        self, points: torch.Tensor, tap_points: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ONE field call on ``points`` ⧺ ``tap_points``: constrained main densities, raw taps."""
        n = points.shape[0]
        dens = self.raw_densities_with_taps(points, tap_points)
        main = self.constraints.apply(dens[:n], points)
        return main, dens[n:]


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


def _inner_field(obj: TomographyObject) -> nn.Module:
    """The field itself when ``obj.field`` is a (Distributed)DataParallel wrapper."""
    wrapped = isinstance(obj.field, (nn.parallel.DistributedDataParallel, nn.DataParallel))
    return obj.field.module if wrapped else obj.field


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

    With ``fold_taps`` and tap points in ``ctx`` the taps ride along in the main field call. The
    plane TV comes from the field (the module inside a data-parallel wrapper) when it has one.
    Returns the total and the terms (``"data"``, and ``"volume_tv"``/``"plane_tv"`` weighted, where
    they are used); the total adds them in that order.
    """
    flat = points.reshape(-1, 3)
    n = flat.shape[0]
    use_tv = weights.volume_tv > 0 and ctx.tv_tap_points is not None
    field = _inner_field(obj)
    use_plane = weights.plane_tv > 0 and hasattr(field, "plane_tv")
    one_call = (fold_taps or not use_tv) and ctx.tv_tap_densities is None
    plane = None  # the plane TV, where the field call returns it
    if one_call and type(obj.constraints) is DensityConstraints:
        # the field's one call also takes the plane TV: one backward node for the planes (not
        # through DataParallel, which would gather one plane TV per replica)
        with_plane = (
            use_plane
            and getattr(field, "plane_tv_from_forward", False)
            and not isinstance(obj.field, nn.DataParallel)
        )
        if use_tv:
            out = obj.raw_densities_with_taps(flat, ctx.tv_tap_points, with_plane_tv=with_plane)
        else:
            out = obj.raw_densities(flat, with_plane_tv=with_plane)
        dens, plane = out if with_plane else (out, None)
        if use_tv:
            ctx.tv_tap_densities = dens[n:]
        if use_plane and plane is None:
            plane = field.plane_tv()
        if dens.dtype == points.dtype == steps.dtype == target.dtype:
            return _fused_loss(obj, field, dens, points, steps, target, weights, use_tv, plane)
        dens = obj.constraints.apply(dens[:n], flat)
    elif use_tv and fold_taps and ctx.tv_tap_densities is None:
        dens, ctx.tv_tap_densities = obj.forward_with_tv_taps(flat, ctx.tv_tap_points)
    else:
        dens = obj.densities(flat)
    pred = dens.reshape(points.shape[:2]).sum(dim=1) * steps
    terms = {"data": (pred - target).square().mean()}
    if use_tv:
        terms["volume_tv"] = weights.volume_tv * volume_tv_loss(obj, ctx)
    if use_plane:
        terms["plane_tv"] = weights.plane_tv * (field.plane_tv() if plane is None else plane)
    total = sum(terms.values())
    return total, terms


def _fused_loss(obj, field, dens, points, steps, target, weights, use_tv, plane):
    c = obj.constraints
    use_plane = plane is not None
    total, terms = ray_loss(
        dens,
        points,
        steps,
        target,
        plane,
        tv_step=obj.tv_step,
        volume_tv_weight=weights.volume_tv if use_tv else 0.0,
        plane_tv_weight=weights.plane_tv if use_plane else 0.0,
        positivity=c.positivity,
        shrinkage=c.shrinkage,
        mask_out_of_bounds=c.mask_out_of_bounds,
        backend=getattr(field, "backend", None),
    )
    data, volume, weighted_plane = terms.unbind()
    out = {"data": data}
    if use_tv:
        out["volume_tv"] = volume
    if use_plane:
        out["plane_tv"] = weighted_plane
    return total, out
