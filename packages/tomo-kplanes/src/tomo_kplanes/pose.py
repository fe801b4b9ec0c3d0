"""The tilt series' alignment learned with the volume: per-tilt shifts and the tilt axis's angle.

A real series is never aligned exactly: stage drift shifts each image by some pixels and the tilt
axis lies a degree or two off the detector's columns. :class:`TiltPose` holds both as parameters
on top of a :class:`~tomo_kplanes.geometry.TiltGeometry`'s own (fixed) values, and the rays of a
training step are cast through it (:meth:`TiltPose.rays`), so the pose's gradient reaches it
through the same field kernels that give the planes theirs (their gradient with respect to the
sample points) and a few elementwise ops on the rays' origins.

The tilt closest to 0 degrees (or ``reference_tilt``) keeps its shift: shifting every image alike
moves the volume in the box, so one image must hold the frame. The names follow quantem's
tomography datasets (``learn_shift``, ``learn_tilt_axis``, a smoothness penalty across tilts that
is off by default); unlike quantem's two Euler angles per tilt, the tilt axis is one angle for the
series unless ``per_tilt_axis`` is set.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from .geometry import TiltGeometry


def reference_tilt_index(angles_deg: torch.Tensor, reference_tilt: int | None) -> int:
    """``reference_tilt`` checked against the series, or the tilt closest to 0 degrees."""
    n = int(angles_deg.numel())
    if reference_tilt is None:
        return int(angles_deg.abs().argmin())
    if isinstance(reference_tilt, bool) or not isinstance(reference_tilt, numbers.Integral):
        raise TypeError(
            f"reference_tilt must be an int (a tilt's index) or None, got {type(reference_tilt).__name__}"
        )
    if not 0 <= reference_tilt < n:
        raise ValueError(f"reference_tilt must be in [0, {n}) for {n} tilts, got {reference_tilt}")
    return int(reference_tilt)


class TiltPose(nn.Module):
    """Learned per-tilt shifts ``(n_tilts, 2)`` (pixels, ``(du, dv)``) and tilt-axis angle
    (degrees), added to ``geometry``'s own.

    Args:
        geometry: the series' geometry; its shifts and tilt axis are the starting values.
        learn_shift: learn every tilt's shift but the reference's.
        learn_tilt_axis: learn the tilt axis's angle.
        per_tilt_axis: one tilt-axis angle per tilt instead of one for the series.
        reference_tilt: the tilt whose shift stays fixed (default: the one closest to 0 degrees).
    """

    def __init__(
        self,
        geometry: TiltGeometry,
        *,
        learn_shift: bool = True,
        learn_tilt_axis: bool = True,
        per_tilt_axis: bool = False,
        reference_tilt: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(geometry, TiltGeometry):
            raise TypeError(f"geometry must be a TiltGeometry, got {type(geometry).__name__}")
        for name, flag in (
            ("learn_shift", learn_shift),
            ("learn_tilt_axis", learn_tilt_axis),
            ("per_tilt_axis", per_tilt_axis),
        ):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        n = geometry.num_tilts
        device = geometry.angles_deg.device
        self.geometry = geometry
        self.reference_tilt = reference_tilt_index(geometry.angles_deg, reference_tilt)
        self.learn_shift, self.learn_tilt_axis = learn_shift, learn_tilt_axis
        base = geometry.shifts if geometry.shifts is not None else torch.zeros(n, 2)
        self.register_buffer("base_shifts", base.to(device=device, dtype=torch.float32).clone())
        free = torch.ones(n, 1, device=device)
        free[self.reference_tilt] = 0.0
        self.register_buffer("shift_free", free)
        self.shift_offsets = nn.Parameter(
            torch.zeros(n, 2, device=device), requires_grad=learn_shift
        )
        self.tilt_axis_offset = nn.Parameter(
            torch.zeros((n,) if per_tilt_axis else (), device=device),
            requires_grad=learn_tilt_axis,
        )
        # tilts in angle order, for the smoothness penalty
        self.register_buffer("angle_order", geometry.angles_deg.argsort().to(device))

    def shifts(self) -> torch.Tensor:
        """``(n_tilts, 2)`` shifts in pixels: the geometry's plus the learned offsets."""
        return self.base_shifts + self.shift_offsets * self.shift_free

    def tilt_axis_deg(self) -> torch.Tensor:
        """The tilt axis's angle in degrees: 0-d, or ``(n_tilts,)`` with ``per_tilt_axis``."""
        return self.geometry.tilt_axis_deg + self.tilt_axis_offset

    def rays(
        self, flat: torch.Tensor, n_samples: int, *, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`TiltGeometry.rays` through the current pose (differentiable in it)."""
        return self.geometry.rays(
            flat, n_samples, dtype=dtype, shifts=self.shifts(), tilt_axis_deg=self.tilt_axis_deg()
        )

    def smoothness(self) -> torch.Tensor:
        """Total variation across tilts (in angle order) of the shifts, and of the tilt-axis
        angles when there is one per tilt: the mean absolute step between neighbours."""
        zero = self.shift_offsets.new_zeros(())
        if self.geometry.num_tilts < 2:
            return zero
        ordered = self.shifts()[self.angle_order]
        total = (ordered[1:] - ordered[:-1]).abs().mean() if self.learn_shift else zero
        if self.tilt_axis_offset.dim() and self.learn_tilt_axis:
            axis = self.tilt_axis_deg()[self.angle_order]
            total = total + (axis[1:] - axis[:-1]).abs().mean()
        return total

    def learned_parameters(self) -> list[nn.Parameter]:
        """The parameters this pose learns (none when both switches are off)."""
        return [p for p in (self.shift_offsets, self.tilt_axis_offset) if p.requires_grad]

    @torch.no_grad()
    def aligned_geometry(self) -> TiltGeometry:
        """A :class:`TiltGeometry` holding the learned pose (on the CPU): project a volume with it
        to compare against the tilt series as recorded."""
        axis = self.tilt_axis_deg()
        if axis.dim():
            raise ValueError(
                "a TiltGeometry holds one tilt-axis angle; this pose has one per tilt "
                "(cast its rays with TiltPose.rays)"
            )
        return TiltGeometry(
            self.geometry.angles_deg.cpu(),
            self.geometry.detector_shape,
            self.shifts().cpu(),
            float(axis),
        )

    @torch.no_grad()
    def table(self) -> list[dict[str, float | int | bool]]:
        """One row per tilt: index, angle, shift ``du``/``dv`` (pixels), tilt axis (degrees) and
        whether it is the reference."""
        shifts = self.shifts().cpu().tolist()
        axis = self.tilt_axis_deg().cpu()
        axes = axis.tolist() if axis.dim() else [float(axis)] * len(shifts)
        return [
            {
                "tilt": i,
                "angle_deg": float(a),
                "shift_u_px": s[0],
                "shift_v_px": s[1],
                "tilt_axis_deg": axes[i],
                "reference": i == self.reference_tilt,
            }
            for i, (a, s) in enumerate(zip(self.geometry.angles_deg.cpu().tolist(), shifts))
        ]


def shift_error_px(learned: torch.Tensor, truth: torch.Tensor, angles_deg: torch.Tensor) -> float:
    """RMS distance in pixels between two ``(n_tilts, 2)`` shift sets after removing what a
    rigid move of the volume explains.

    Moving the volume by ``(x, y, z)`` in the box shifts tilt ``θ``'s image by ``x`` along the
    columns and ``y cos θ − z sin θ`` along the rows, the same for a reconstruction with the
    shifts ``learned`` as for one with ``truth``; those three components are fitted out by least
    squares before the distance is taken.
    """
    diff = (learned - truth).double().cpu()
    theta = torch.deg2rad(angles_deg.double().cpu())
    du = diff[:, 0] - diff[:, 0].mean()
    basis = torch.stack([torch.cos(theta), -torch.sin(theta)], dim=1)
    fit = torch.linalg.lstsq(basis, diff[:, 1:2]).solution
    dv = diff[:, 1] - (basis @ fit)[:, 0]
    return math.sqrt(float((du.square() + dv.square()).mean()))


@torch.no_grad()
def tilt_residuals(
    object_model: nn.Module,
    cast,
    tilt_series: torch.Tensor,
    n_samples: int,
    *,
    chunk: int = 8192,
) -> torch.Tensor:
    """float32 ``(n_tilts,)``: per tilt, the RMS over its pixels of the field's projection (rays
    from ``cast(flat, n_samples)``, e.g. :meth:`TiltPose.rays`) minus the recorded image."""
    n_tilts = tilt_series.shape[0]
    target = tilt_series.reshape(-1).float()
    flat = torch.arange(target.numel(), device=tilt_series.device)
    squares = torch.empty_like(target)
    for start in range(0, flat.numel(), chunk):
        idx = flat[start : start + chunk]
        points, steps = cast(idx, n_samples)
        dens = object_model.densities(points.reshape(-1, 3)).reshape(points.shape[:2])
        squares[start : start + chunk] = (dens.sum(1) * steps - target[idx]).square()
    return squares.reshape(n_tilts, -1).mean(1).sqrt()
