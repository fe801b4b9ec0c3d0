"""Parallel-beam single-axis tilt geometry, rays with box clipping, and line integrals.

Conventions: the volume fills ``[-1, 1]³`` with coordinates ``(x, y, z)``; a volume array has shape
``(Z, Y, X)`` (MRC order) and index ``k`` along an axis of size ``n`` sits at ``-1 + 2k/(n − 1)``.
The tilt axis is the volume's x axis. A tilt series has shape ``(n_tilts, n_v, n_u)``: detector
columns ``u`` run along x, rows ``v`` across the tilt axis. At tilt angle ``θ`` (degrees) the beam
travels along ``d = (0, sin θ, cos θ)`` and detector row coordinate ``v`` lies along
``e_v = (0, cos θ, −sin θ)``; at ``θ = 0`` the beam is the z axis and the detector is the XY plane.
Pixel ``(i, j)`` maps to ``v = -1 + 2 (i + shift_v) / (n_v − 1)``, ``u = -1 + 2 (j + shift_u) / (n_u − 1)``
(per-tilt shifts in pixels). With a tilt-axis angle ``ψ`` (the axis seen in the images at ``ψ`` from
the column direction toward the rows) the pixel's offset ``c`` from the detector centre is turned
by ``−ψ`` before the shift: ``(u, v)`` in pixels is ``R(−ψ) c + shift``. Each ray carries a fixed number of samples at the midpoints of equal
steps between its entry into and exit from the box; its line integral is the sum of the densities
times the step (normalised length units: the box is 2 wide). Rays that miss the box get step 0.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._checks import real_tensor


@dataclass
class TiltGeometry:
    """Angles (degrees), detector shape ``(n_v, n_u)``, optional per-tilt shifts ``(du, dv)`` in
    pixels and the tilt axis's angle in the images (degrees, 0: along the detector's columns)."""

    angles_deg: torch.Tensor
    detector_shape: tuple[int, int]
    shifts: torch.Tensor | None = None
    tilt_axis_deg: float = 0.0

    def __post_init__(self) -> None:
        self.angles_deg = torch.as_tensor(self.angles_deg, dtype=torch.float32).reshape(-1)
        if self.angles_deg.numel() == 0:
            raise ValueError("angles_deg must hold at least one tilt angle")
        if not torch.isfinite(self.angles_deg).all():
            raise ValueError("angles_deg holds non-finite values")
        n_v, n_u = (int(x) for x in self.detector_shape)
        if n_v < 2 or n_u < 2:
            raise ValueError(f"detector_shape must be at least (2, 2), got {self.detector_shape}")
        self.detector_shape = (n_v, n_u)
        if self.shifts is not None:
            self.shifts = torch.as_tensor(self.shifts, dtype=torch.float32)
            if self.shifts.shape != (self.num_tilts, 2):
                raise ValueError(
                    f"shifts must have shape (n_tilts, 2) = ({self.num_tilts}, 2), got {tuple(self.shifts.shape)}"
                )
            if not torch.isfinite(self.shifts).all():
                raise ValueError("shifts holds non-finite values")
        if isinstance(self.tilt_axis_deg, bool) or not isinstance(self.tilt_axis_deg, numbers.Real):
            raise TypeError(
                f"tilt_axis_deg must be a real number (degrees), got {type(self.tilt_axis_deg).__name__}"
            )
        self.tilt_axis_deg = float(self.tilt_axis_deg)
        if not math.isfinite(self.tilt_axis_deg):
            raise ValueError(f"tilt_axis_deg must be finite, got {self.tilt_axis_deg}")

    @property
    def num_tilts(self) -> int:
        return int(self.angles_deg.numel())

    @property
    def num_rays(self) -> int:
        return self.num_tilts * self.detector_shape[0] * self.detector_shape[1]

    def to(self, device: torch.device | str) -> TiltGeometry:
        return TiltGeometry(
            self.angles_deg.to(device),
            self.detector_shape,
            None if self.shifts is None else self.shifts.to(device),
            self.tilt_axis_deg,
        )

    def ray_indices(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Split flat pixel indices (tilt-major, then row, then column) into (tilt, row, column)."""
        n_v, n_u = self.detector_shape
        return flat // (n_v * n_u), (flat // n_u) % n_v, flat % n_u

    def rays(
        self,
        flat: torch.Tensor,
        n_samples: int,
        *,
        dtype: torch.dtype = torch.float32,
        shifts: torch.Tensor | None = None,
        tilt_axis_deg: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample points ``(B, n_samples, 3)`` and step lengths ``(B,)`` of the rays ``flat``.

        ``shifts`` ``(n_tilts, 2)`` and ``tilt_axis_deg`` (0-d, or ``(n_tilts,)``: one angle per
        tilt) replace the geometry's own and may carry gradients (a learned pose): the points
        follow them, while each ray's entry into the box and its step are held at their values
        (the samples move with the ray, not along it), so the pose's gradient is that of the line
        integral through the field with the box boundary's terms left out.
        """
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {n_samples}")
        device = flat.device
        tilt, row, col = self.ray_indices(flat)
        n_v, n_u = self.detector_shape
        theta = torch.deg2rad(self.angles_deg.to(device=device, dtype=dtype))[tilt]
        shifts = self.shifts if shifts is None else shifts
        axis = self.tilt_axis_deg if tilt_axis_deg is None else tilt_axis_deg
        col_f = col.to(dtype)
        row_f = row.to(dtype)
        turned = isinstance(axis, torch.Tensor) or axis != 0.0
        if turned:  # offsets from the detector's centre, turned by -psi
            psi = torch.deg2rad(torch.as_tensor(axis, device=device, dtype=dtype))
            if psi.dim():
                psi = psi[tilt]
            cu, cv = col_f - 0.5 * (n_u - 1), row_f - 0.5 * (n_v - 1)
            c, s = torch.cos(psi), torch.sin(psi)
            col_f, row_f = c * cu + s * cv, c * cv - s * cu
        if shifts is not None:
            sh = shifts.to(device=device, dtype=dtype)[tilt]
            col_f = col_f + sh[:, 0]
            row_f = row_f + sh[:, 1]
        if turned:
            u = 2.0 * col_f / (n_u - 1)
            v = 2.0 * row_f / (n_v - 1)
        else:
            u = -1.0 + 2.0 * col_f / (n_u - 1)
            v = -1.0 + 2.0 * row_f / (n_v - 1)
        sin, cos = torch.sin(theta), torch.cos(theta)
        origin = torch.stack([u, v * cos, -v * sin], dim=-1)
        direction = torch.stack([torch.zeros_like(sin), sin, cos], dim=-1)
        t_near, t_far = _clip_to_box(origin.detach(), direction)
        length = (t_far - t_near).clamp_min(0.0)
        step = length / n_samples
        k = torch.arange(n_samples, device=device, dtype=dtype) + 0.5
        t = t_near.unsqueeze(1) + k.unsqueeze(0) * step.unsqueeze(1)
        points = origin.unsqueeze(1) + t.unsqueeze(-1) * direction.unsqueeze(1)
        return points, step


def _clip_to_box(origin: torch.Tensor, direction: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Slab test against ``[-1, 1]³``: entry and exit parameters (exit < entry for a miss)."""
    parallel = direction.abs() < 1e-12
    safe = torch.where(parallel, torch.ones_like(direction), direction)
    t1 = (-1.0 - origin) / safe
    t2 = (1.0 - origin) / safe
    lo = torch.minimum(t1, t2)
    hi = torch.maximum(t1, t2)
    inside = origin.abs() <= 1.0
    big = torch.full_like(lo, 1e30)
    # a ray parallel to a slab is unconstrained by it when inside, and misses when outside
    lo = torch.where(parallel, torch.where(inside, -big, big), lo)
    hi = torch.where(parallel, torch.where(inside, big, -big), hi)
    return lo.max(dim=-1).values, hi.min(dim=-1).values


def sample_volume(volume: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """Trilinear samples of a ``(Z, Y, X)`` volume at ``(..., 3)`` points; zero outside the box."""
    grid = points.reshape(1, 1, 1, -1, 3).to(volume.dtype)
    out = F.grid_sample(
        volume[None, None], grid, mode="bilinear", padding_mode="zeros", align_corners=True
    )
    return out.reshape(points.shape[:-1])


def line_integrals(
    density: Callable[[torch.Tensor], torch.Tensor],
    geometry: TiltGeometry,
    flat: torch.Tensor,
    n_samples: int,
    *,
    chunk: int = 4096,
) -> torch.Tensor:
    """``Σ density(p) · step`` along the rays ``flat``, in chunks of rays."""
    out = []
    for start in range(0, flat.numel(), chunk):
        idx = flat[start : start + chunk]
        pts, step = geometry.rays(idx, n_samples)
        dens = density(pts.reshape(-1, 3)).reshape(pts.shape[:2])
        out.append(dens.sum(dim=1) * step)
    if not out:
        return torch.zeros(0, device=flat.device)
    return torch.cat(out)


def project_volume(
    volume: torch.Tensor,
    geometry: TiltGeometry,
    *,
    n_samples: int | None = None,
    chunk: int = 8192,
) -> torch.Tensor:
    """Tilt series ``(n_tilts, n_v, n_u)`` of a ``(Z, Y, X)`` volume (trilinear ray sampling)."""
    real_tensor("volume", volume, (3,), "(Z, Y, X)")
    n_samples = n_samples or 2 * max(volume.shape)
    flat = torch.arange(geometry.num_rays, device=volume.device)
    values = line_integrals(
        lambda p: sample_volume(volume, p), geometry, flat, n_samples, chunk=chunk
    )
    return values.reshape(geometry.num_tilts, *geometry.detector_shape)


def tilt_range(max_angle: float, step: float) -> torch.Tensor:
    """Angles ``-max_angle, …, +max_angle`` in steps of ``step`` degrees."""
    n = math.floor(2 * max_angle / step + 1e-6) + 1
    return torch.linspace(-max_angle, -max_angle + (n - 1) * step, n)


def grid_points(shape: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """``(Z·Y·X, 3)`` coordinates ``(x, y, z)`` of the voxels of a ``(Z, Y, X)`` volume."""
    z, y, x = (torch.linspace(-1, 1, n, device=device) for n in shape)
    zz, yy, xx = torch.meshgrid(z, y, x, indexing="ij")
    return torch.stack([xx, yy, zz], dim=-1).reshape(-1, 3)
