"""``ray_loss``: the backend choice, the reference path and the plan cache of eager calls."""

from __future__ import annotations

import torch

from triton_dispatch import uses_triton
from triton_dispatch.launch import PlanCache, call_key

from .op import EagerRayLoss, kernels_for, pack_settings, ray_loss_op
from .reference import ray_loss_reference
from .validation import check_ray_loss


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
        TypeError: a non-tensor, or dtypes other than one of float32/float64 shared by all.
        ValueError: shapes that do not fit together, tensors on different devices, a negative
            ``shrinkage``, or a non-positive ``tv_step`` with taps.
    """
    settings = (
        float(tv_step), float(volume_tv_weight), float(plane_tv_weight), bool(positivity),
        float(shrinkage), bool(mask_out_of_bounds),
    )  # fmt: skip
    tensors = (densities, points, steps, target, plane_tv)
    if not torch.compiler.is_compiling():
        stride = points.stride() if isinstance(points, torch.Tensor) else None
        key = call_key(tensors, stride, *settings, backend, torch.is_grad_enabled())
        if key is not None:
            return _PLANS.get(key, lambda: _plan(tensors, settings, backend))(*tensors)
    return _run(tensors, settings, check_ray_loss(tensors, settings, backend))


_PLANS: PlanCache = PlanCache("tomo_kplanes.ray_loss")


def _kernel_path(tensors, chosen: str) -> bool:
    points = tensors[1]
    return uses_triton(chosen) and points.shape[0] > 0 and points.shape[1] > 0


def _reference(tensors, settings):
    tv_step, volume_w, plane_w, positivity, shrinkage, mask = settings
    return ray_loss_reference(
        *tensors, tv_step=tv_step, volume_tv_weight=volume_w, plane_tv_weight=plane_w,
        positivity=positivity, shrinkage=shrinkage, mask_out_of_bounds=mask,
    )  # fmt: skip


def _contiguous(tensors):
    densities, points, steps, target, plane_tv = tensors
    return densities.contiguous(), points, steps.contiguous(), target.contiguous(), plane_tv


def _run(tensors, settings, chosen: str):
    if not _kernel_path(tensors, chosen):
        return _reference(tensors, settings)
    tensors = _contiguous(tensors)
    if torch.compiler.is_compiling():
        total, terms, _ = ray_loss_op(*tensors, *pack_settings(settings))
        return total, terms
    return EagerRayLoss.apply(*tensors, kernels_for(tensors, settings))[:2]


def _plan(tensors, settings, backend):
    chosen = check_ray_loss(tensors, settings, backend)
    if not _kernel_path(tensors, chosen):
        return lambda *tensors: _reference(tensors, settings)
    if not all(t.is_contiguous() for t in (tensors[0], tensors[2], tensors[3])):
        return lambda *tensors: _run(tensors, settings, chosen)
    kernels = kernels_for(tensors, settings)

    def run(*tensors):
        total, terms, _ = EagerRayLoss.apply(*tensors, kernels)
        return total, terms

    return run
