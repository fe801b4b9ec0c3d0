"""The specification of ``tilted_plane_features`` in plain PyTorch (``grid_sample``).

Axis conventions (fixed; the Triton kernels follow them exactly):

* ``points[:, 0:3]`` are ``(x, y, z)`` in the volume's normalised frame, ``[-1, 1]`` spanning the
  volume. Each rotation ``R_t`` maps a point to ``q = R_t @ p`` (``q = p @ R_t.T``).
* ``planes`` has shape ``(3T, C, H, W)``; plane ``3t + k`` belongs to rotation ``t``:

  ====  ======  =========================  =========================
  k     plane   coordinate indexing W       coordinate indexing H
  ====  ======  =========================  =========================
  0     XY      ``q_x``                     ``q_y``
  1     ZX      ``q_z``                     ``q_x``
  2     YZ      ``q_y``                     ``q_z``
  ====  ======  =========================  =========================

  i.e. plane ``k`` is sampled at ``grid = (q[k], q[(k + 1) % 3])`` in ``grid_sample``'s
  ``(x → W, y → H)`` order.
* Sampling is bilinear with ``align_corners=True`` (coordinate ``-1`` is the centre of the first
  texel, ``+1`` of the last) and ``padding_mode="border"``: points outside ``[-1, 1]`` (a rotated
  cube's corners) take the edge value, and their gradient w.r.t. the clamped coordinate is zero.
* Output column ``t * C + c`` holds ``XY_t[c] · ZX_t[c] · YZ_t[c]`` at point ``n``.
* Non-finite coordinates: where ``q = R_t p_n`` has a NaN or infinite component (a bad point or a
  bad rotation), the ``C`` features of that (point, rotation) pair are NaN and the pair contributes
  nothing to any gradient. ``grid_sample`` itself has no usable answer there (finite values that
  differ between CPU and CUDA, and a crash in its CPU backward), so the spec masks such pairs
  before sampling, and the kernels do the same.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: For plane k: (index of the coordinate along W, index of the coordinate along H).
PLANE_AXES: tuple[tuple[int, int], ...] = ((0, 1), (2, 0), (1, 2))


def rotate_points(points: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """``(T, N, 3)``: every point rotated by every rotation, ``q[t, n] = R_t @ p[n]``."""
    return torch.einsum("tij,nj->tni", rotations, points)


def tilted_plane_features_reference(
    points: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor
) -> torch.Tensor:
    """``(N, T·C)`` features of ``points`` from ``T`` rotated triplets of feature planes.

    Builds the ``(3T, C, N)`` sampled intermediate that the fused kernels avoid. Differentiable
    w.r.t. all three inputs through ``grid_sample``'s own backward.
    """
    n = points.shape[0]
    t = rotations.shape[0]
    c = planes.shape[1]
    with torch.no_grad():
        valid = torch.isfinite(rotate_points(points, rotations)).all(dim=-1)  # (T, N)
    # zero the bad entries before the product too, so that 0 · NaN cannot reach the gradients
    safe_points = torch.where(torch.isfinite(points), points, torch.zeros_like(points))
    safe_rotations = torch.where(torch.isfinite(rotations), rotations, torch.zeros_like(rotations))
    q = rotate_points(safe_points, safe_rotations)
    q = torch.where(valid.unsqueeze(-1), q, torch.zeros_like(q))  # (T, N, 3)
    grids = torch.stack([q[..., list(axes)] for axes in PLANE_AXES], dim=1)  # (T, 3, N, 2)
    grids = grids.reshape(3 * t, 1, n, 2)
    samples = F.grid_sample(
        planes, grids, mode="bilinear", padding_mode="border", align_corners=True
    )  # (3T, C, 1, N)
    samples = samples.reshape(t, 3, c, n)
    product = samples[:, 0] * samples[:, 1] * samples[:, 2]  # (T, C, N)
    product = torch.where(valid.unsqueeze(1), product, torch.full_like(product, float("nan")))
    return product.permute(2, 0, 1).reshape(n, t * c)
