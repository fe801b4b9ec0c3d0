"""``ray_loss``: the public function over the declared op."""

from __future__ import annotations

import torch

from .op import RAY_LOSS


def ray_loss(
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
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Data term, volume TV and plane TV of one reconstruction step.

    Args:
        densities: ``(B·S + 4·M,)`` raw field densities: the ``S`` samples of each of the ``B``
            rays (ray-major), then ``M`` volume-TV base points and their ``+h`` neighbours along
            x, y and z (tap-major, as :meth:`TomographyObject.sample_tv_tap_coords` lays them
            out). ``M = 0``: no volume TV.
        points: ``(B, S, 3)`` the ray samples' coordinates (for the out-of-bounds mask).
        steps: ``(B,)`` each ray's step length; its line integral is ``Σ_s density · step``.
        target: ``(B,)`` measured line integrals.
        plane_tv: optional 0-d plane TV of the field, added with ``plane_tv_weight``.
        tv_step: the taps' finite-difference step ``h``.
        volume_tv_weight, plane_tv_weight: the TV weights.
        positivity, shrinkage, mask_out_of_bounds: the hard constraints of the ray samples (see
            :class:`DensityConstraints`); taps stay raw.
        backend: ``"auto"`` (default), ``"triton"``, ``"interpret"`` or ``"torch"``.

    Returns:
        ``(total, terms)``: the 0-d loss and ``(3,)`` terms ``[data, weighted volume TV, weighted
        plane TV]`` (zero for a term not asked for); both differentiable w.r.t. ``densities`` and
        ``plane_tv``. ``total`` adds the terms in that order.

    Raises:
        TypeError: a non-tensor, dtypes other than one of float32/float64 shared by all, or a
            setting of another type (a float for ``tv_step``, the weights and ``shrinkage``, a
            bool for ``positivity`` and ``mask_out_of_bounds``).
        ValueError: shapes that do not fit together, tensors on different devices, a setting
            that is not finite, a negative ``shrinkage``, or a non-positive ``tv_step`` with taps.
    """
    return RAY_LOSS(
        densities, points, steps, target, plane_tv, backend=backend, tv_step=tv_step,
        volume_tv_weight=volume_tv_weight, plane_tv_weight=plane_tv_weight,
        positivity=positivity, shrinkage=shrinkage, mask_out_of_bounds=mask_out_of_bounds,
    )  # fmt: skip
