"""Seeded test volumes and tilt-series simulation."""

from __future__ import annotations

import math

import torch

from .geometry import TiltGeometry, grid_points, project_volume

# Modified 3D Shepp–Logan: intensity, semi-axes (a, b, c), centre (x0, y0, z0), Euler angles
# (phi, theta, psi) in degrees (z–x–z convention); the usual Kak–Slaney / Toft parameters.
_SHEPP_LOGAN = (
    (1.0, 0.69, 0.92, 0.81, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
    (-0.8, 0.6624, 0.874, 0.78, 0.0, -0.0184, 0.0, 0.0, 0.0, 0.0),
    (-0.2, 0.11, 0.31, 0.22, 0.22, 0.0, 0.0, -18.0, 0.0, 10.0),
    (-0.2, 0.16, 0.41, 0.28, -0.22, 0.0, 0.0, 18.0, 0.0, 10.0),
    (0.1, 0.21, 0.25, 0.41, 0.0, 0.35, -0.15, 0.0, 0.0, 0.0),
    (0.1, 0.046, 0.046, 0.05, 0.0, 0.1, 0.25, 0.0, 0.0, 0.0),
    (0.1, 0.046, 0.046, 0.05, 0.0, -0.1, 0.25, 0.0, 0.0, 0.0),
    (0.1, 0.046, 0.023, 0.05, -0.08, -0.605, 0.0, 0.0, 0.0, 0.0),
    (0.1, 0.023, 0.023, 0.02, 0.0, -0.606, 0.0, 0.0, 0.0, 0.0),
    (0.1, 0.023, 0.046, 0.02, 0.06, -0.605, 0.0, 0.0, 0.0, 0.0),
)


def _euler_zxz(phi: float, theta: float, psi: float) -> torch.Tensor:
    def rz(a):
        c, s = math.cos(a), math.sin(a)
        return torch.tensor([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])

    def rx(a):
        c, s = math.cos(a), math.sin(a)
        return torch.tensor([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])

    return rz(math.radians(phi)) @ rx(math.radians(theta)) @ rz(math.radians(psi))


def shepp_logan_3d(size: int | tuple[int, int, int], *, device: torch.device | str = "cpu") -> torch.Tensor:
    """The modified 3D Shepp–Logan phantom as a ``(Z, Y, X)`` float32 volume in ``[0, 1]``."""
    shape = (size, size, size) if isinstance(size, int) else tuple(size)
    pts = grid_points(shape, device)
    vol = torch.zeros(pts.shape[0], device=device)
    for amp, a, b, c, x0, y0, z0, phi, theta, psi in _SHEPP_LOGAN:
        rot = _euler_zxz(phi, theta, psi).to(device)
        local = (pts - torch.tensor([x0, y0, z0], device=device)) @ rot
        inside = (local / torch.tensor([a, b, c], device=device)).square().sum(-1) <= 1.0
        vol = vol + amp * inside
    return vol.reshape(shape).clamp_min(0.0)


def nanoparticle_phantom(
    size: int,
    *,
    particles: int = 12,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Dense particles (spheres, cubes, octahedra) on a thin low-density support film, seeded.

    The film is a slab normal to z (the beam direction at zero tilt), as for particles on a carbon
    grid; particle densities are 0.6–1.0, the film 0.15.
    """
    g = torch.Generator().manual_seed(seed)
    pts = grid_points((size, size, size), "cpu")
    vol = torch.zeros(pts.shape[0])
    film = (pts[:, 2] - (-0.3)).abs() <= 0.06
    vol[film & (pts[:, :2].abs() <= 0.9).all(-1)] = 0.15
    for i in range(particles):
        radius = 0.06 + 0.12 * torch.rand((), generator=g).item()
        centre = torch.empty(3).uniform_(-0.7, 0.7, generator=g)
        centre[2] = -0.24 + radius  # resting on the film
        q, _ = torch.linalg.qr(torch.randn(3, 3, generator=g))
        local = (pts - centre) @ q
        kind = i % 3
        if kind == 0:
            inside = local.norm(dim=-1) <= radius
        elif kind == 1:
            inside = local.abs().amax(-1) <= radius * 0.8
        else:
            inside = local.abs().sum(-1) <= radius * 1.3
        vol[inside] = 0.6 + 0.4 * torch.rand((), generator=g).item()
    return vol.reshape(size, size, size).to(device)


def simulate_tilt_series(
    volume: torch.Tensor,
    geometry: TiltGeometry,
    *,
    dose: float | None = None,
    seed: int = 0,
    n_samples: int | None = None,
) -> torch.Tensor:
    """Project ``volume`` over ``geometry``; with ``dose`` add Poisson noise.

    ``dose`` is the expected count of the brightest line integral: each pixel becomes
    ``Poisson(p · dose / max p) · max p / dose``, an unbiased noisy copy.
    """
    proj = project_volume(volume, geometry.to(volume.device), n_samples=n_samples)
    if dose is None:
        return proj
    if dose <= 0:
        raise ValueError(f"dose must be positive, got {dose}")
    g = torch.Generator().manual_seed(seed)
    peak = proj.max().clamp_min(1e-12)
    counts = torch.poisson((proj.clamp_min(0) * dose / peak).cpu(), generator=g)
    return (counts * peak.cpu() / dose).to(proj.device)
