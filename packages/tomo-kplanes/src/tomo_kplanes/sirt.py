"""SIRT on the same geometry as the neural field (ray-sampled trilinear projector and its exact
adjoint through autograd), in PyTorch, on any device."""

from __future__ import annotations

import torch

from ._checks import real_tensor
from .geometry import TiltGeometry, line_integrals, sample_volume


def _project(volume, geometry, flat, n_samples, chunk):
    return line_integrals(
        lambda p: sample_volume(volume, p), geometry, flat, n_samples, chunk=chunk
    )


def _backproject(values, shape, geometry, flat, n_samples, chunk, device):
    """Adjoint of the projector: ``Aᵀ values`` by a vector–Jacobian product per chunk of rays."""
    out = torch.zeros(shape, device=device)
    for start in range(0, flat.numel(), chunk):
        idx = flat[start : start + chunk]
        vol = torch.zeros(shape, device=device, requires_grad=True)
        proj = _project(vol, geometry, idx, n_samples, chunk)
        (grad,) = torch.autograd.grad(proj, vol, values[start : start + chunk])
        out += grad
    return out


def sirt(
    tilt_series: torch.Tensor,
    geometry: TiltGeometry,
    shape: tuple[int, int, int],
    *,
    iterations: int = 50,
    relaxation: float = 1.0,
    n_samples: int | None = None,
    positivity: bool = True,
    chunk: int = 16384,
) -> torch.Tensor:
    """``x ← x + λ C Aᵀ R (b − A x)`` with ``R = 1 / A1`` and ``C = 1 / Aᵀ1``."""
    real_tensor("tilt_series", tilt_series, (3,), "(n_tilts, n_v, n_u)")
    expected = (geometry.num_tilts, *geometry.detector_shape)
    if tuple(tilt_series.shape) != expected:
        raise ValueError(
            f"tilt_series must have the geometry's shape (n_tilts, n_v, n_u) = {expected}, "
            f"got {tuple(tilt_series.shape)}"
        )
    device = tilt_series.device
    geometry = geometry.to(device)
    n_samples = n_samples or 2 * max(shape)
    flat = torch.arange(geometry.num_rays, device=device)
    b = tilt_series.reshape(-1).float()
    row = _project(torch.ones(shape, device=device), geometry, flat, n_samples, chunk)
    col = _backproject(torch.ones_like(b), shape, geometry, flat, n_samples, chunk, device)
    inv_row = torch.where(row > 1e-8, 1.0 / row.clamp_min(1e-8), torch.zeros_like(row))
    inv_col = torch.where(col > 1e-8, 1.0 / col.clamp_min(1e-8), torch.zeros_like(col))
    x = torch.zeros(shape, device=device)
    with torch.no_grad():
        for _ in range(iterations):
            resid = (b - _project(x, geometry, flat, n_samples, chunk)) * inv_row
            with torch.enable_grad():
                update = _backproject(resid, shape, geometry, flat, n_samples, chunk, device)
            x = x + relaxation * inv_col * update
            if positivity:
                x = x.clamp_min(0.0)
    return x
