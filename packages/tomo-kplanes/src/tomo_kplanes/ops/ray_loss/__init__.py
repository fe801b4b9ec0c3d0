"""``ray_loss``: the reconstruction objective from the field's densities in one fused pass.

From the raw densities of a step's field call (the ``B·S`` ray samples, then the ``4·M`` volume-TV
taps) it applies the hard constraints to the ray samples, integrates each ray, and returns the
mean squared error against the measured line integrals plus the weighted volume TV of the taps and
the weighted plane TV: the ~30 pointwise launches and their backward of the PyTorch formulation
(``reference.py``, the specification and the CPU path) become two forward launches and one
backward launch. Eager calls run the kernels through an ``autograd.Function``; under
``torch.compile`` they run as the custom op ``tomo_kplanes::ray_loss``. Everything that depends on
the arguments' metadata (checks, backend, sizes, grids) is resolved once per kind of call.
"""

from __future__ import annotations

import math

import torch

from triton_dispatch import common_device, select_backend, uses_triton
from triton_dispatch.compile_ahead import backward_follows
from triton_dispatch.launch import PlanCache, call_key

from .reference import apply_constraints, ray_loss_reference, volume_tv_from_taps

__all__ = ["apply_constraints", "ray_loss", "ray_loss_reference", "volume_tv_from_taps"]

_SUPPORTED_DTYPES = (torch.float32, torch.float64)
_NAMES = ("densities", "points", "steps", "target", "plane_tv")


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
    return _run(tensors, settings, _check(tensors, settings, backend))


_PLANS: PlanCache = PlanCache("tomo_kplanes.ray_loss")


def _check(tensors, settings, backend) -> str:
    for name, t in zip(_NAMES, tensors):
        if t is None and name == "plane_tv":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be float32 or float64, got {t.dtype}")
    densities, points, steps, target, plane_tv = tensors
    if points.dim() != 3 or points.shape[2] != 3:
        raise ValueError(f"points must have shape (B, S, 3), got {tuple(points.shape)}")
    b, s = points.shape[0], points.shape[1]
    for name, t in (("steps", steps), ("target", target)):
        if t.dim() != 1 or t.shape[0] != b:
            raise ValueError(
                f"{name} must have shape (B,) = ({b},) like points, got {tuple(t.shape)}"
            )
    if densities.dim() != 1 or densities.shape[0] < b * s or (densities.shape[0] - b * s) % 4:
        raise ValueError(
            f"densities must have shape (B·S + 4·M,) with B·S = {b * s} from points, "
            f"got {tuple(densities.shape)}"
        )
    if plane_tv is not None and plane_tv.dim() != 0:
        raise ValueError(f"plane_tv must be a 0-d tensor, got shape {tuple(plane_tv.shape)}")
    dtypes = {t.dtype for t in tensors[:4]}
    if len(dtypes) != 1:
        raise TypeError(
            "densities, points, steps and target must share one dtype, got "
            + ", ".join(str(t.dtype) for t in tensors[:4])
        )
    tv_step, _, _, _, shrinkage, _ = settings
    if not all(math.isfinite(x) for x in settings if isinstance(x, float)):
        raise ValueError("tv_step, the weights and shrinkage must be finite numbers")
    if shrinkage < 0:
        raise ValueError(f"shrinkage must be >= 0, got {shrinkage}")
    if densities.shape[0] > b * s and tv_step <= 0:
        raise ValueError(f"tv_step must be > 0 when densities hold taps, got {tv_step}")
    device = common_device(tensors, names=_NAMES)
    return select_backend(device=device, backend=backend)


def _kernel_path(tensors, chosen: str) -> bool:
    points = tensors[1]
    return uses_triton(chosen) and points.shape[0] > 0 and points.shape[1] > 0


def _reference(tensors, settings):
    tv_step, volume_w, plane_w, positivity, shrinkage, mask = settings
    return ray_loss_reference(
        *tensors, tv_step=tv_step, volume_tv_weight=volume_w, plane_tv_weight=plane_w,
        positivity=positivity, shrinkage=shrinkage, mask_out_of_bounds=mask,
    )  # fmt: skip


def _kernels(tensors, settings):
    from .kernels import plan_for

    densities, points, _, _, plane_tv = tensors
    b, s = points.shape[0], points.shape[1]
    taps = (densities.shape[0] - b * s) // 4
    return plan_for(
        b, s, taps, points.stride(), densities.dtype, densities.device, plane_tv is not None,
        *settings, backward=backward_follows(densities, plane_tv),
    )  # fmt: skip


def _contiguous(tensors):
    densities, points, steps, target, plane_tv = tensors
    return densities.contiguous(), points, steps.contiguous(), target.contiguous(), plane_tv


def _run(tensors, settings, chosen: str):
    if not _kernel_path(tensors, chosen):
        return _reference(tensors, settings)
    tensors = _contiguous(tensors)
    if torch.compiler.is_compiling():
        total, terms, _ = _ray_loss_op(*tensors, *_pack(settings))
        return total, terms
    return _EagerRayLoss.apply(*tensors, _kernels(tensors, settings))[:2]


def _plan(tensors, settings, backend):
    chosen = _check(tensors, settings, backend)
    if not _kernel_path(tensors, chosen):
        return lambda *tensors: _reference(tensors, settings)
    if not all(t.is_contiguous() for t in (tensors[0], tensors[2], tensors[3])):
        return lambda *tensors: _run(tensors, settings, chosen)
    kernels = _kernels(tensors, settings)

    def run(*tensors):
        total, terms, _ = _EagerRayLoss.apply(*tensors, kernels)
        return total, terms

    return run


class _EagerRayLoss(torch.autograd.Function):
    """The registered op's forward and backward without the custom-op dispatch."""

    @staticmethod
    def forward(ctx, densities, points, steps, target, plane_tv, kernels):
        total, terms, resid = kernels.forward(densities, points, steps, target, plane_tv)
        ctx.mark_non_differentiable(resid)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(densities, points, steps, resid)
        ctx.kernels = kernels
        ctx.has_plane_tv = plane_tv is not None
        return total, terms, resid

    @staticmethod
    def backward(ctx, grad_total, grad_terms, _grad_resid):
        densities, points, steps, resid = ctx.saved_tensors
        if grad_total is None:
            grad_total = torch.zeros((), dtype=densities.dtype, device=densities.device)
        grad, grad_plane = ctx.kernels.backward(
            grad_total, grad_terms, densities, points, steps, resid, ctx.has_plane_tv
        )
        return grad, None, None, None, grad_plane, None


def _pack(settings) -> tuple[list[float], list[bool]]:
    """The settings as the custom ops take them: ``[tv_step, volume_tv_weight, plane_tv_weight,
    shrinkage]`` and ``[positivity, mask_out_of_bounds]``."""
    tv_step, volume_w, plane_w, positivity, shrinkage, mask = settings
    return [tv_step, volume_w, plane_w, shrinkage], [positivity, mask]


def _unpack(scalars, flags) -> tuple:
    tv_step, volume_w, plane_w, shrinkage = scalars
    return (tv_step, volume_w, plane_w, flags[0], shrinkage, flags[1])


@torch.library.custom_op("tomo_kplanes::ray_loss", mutates_args=())
def _ray_loss_op(
    densities: torch.Tensor,
    points: torch.Tensor,
    steps: torch.Tensor,
    target: torch.Tensor,
    plane_tv: torch.Tensor | None,
    scalars: list[float],
    flags: list[bool],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tensors = (densities, points, steps, target, plane_tv)
    return _kernels(tensors, _unpack(scalars, flags)).forward(*tensors)


@_ray_loss_op.register_fake
def _(densities, points, steps, target, plane_tv, scalars, flags):
    new = densities.new_empty
    return new(()), new(3), new(points.shape[0])


@torch.library.custom_op("tomo_kplanes::ray_loss_backward", mutates_args=())
def _ray_loss_backward_op(
    grad_total: torch.Tensor,
    grad_terms: torch.Tensor | None,
    densities: torch.Tensor,
    points: torch.Tensor,
    steps: torch.Tensor,
    resid: torch.Tensor,
    has_plane_tv: bool,
    scalars: list[float],
    flags: list[bool],
) -> tuple[torch.Tensor, torch.Tensor]:
    # the plan depends on whether there is a plane TV, not on its value
    plane_tv = densities.new_empty(()) if has_plane_tv else None
    kernels = _kernels((densities, points, steps, None, plane_tv), _unpack(scalars, flags))
    grad, grad_plane = kernels.backward(
        grad_total, grad_terms, densities, points, steps, resid, has_plane_tv
    )
    return grad, grad_plane if grad_plane is not None else densities.new_zeros(())


@_ray_loss_backward_op.register_fake
def _(grad_total, grad_terms, densities, *rest):
    return torch.empty_like(densities), densities.new_empty(())


def _setup_context(ctx, inputs, output) -> None:
    densities, points, steps, _, plane_tv, scalars, flags = inputs
    ctx.mark_non_differentiable(output[2])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(densities, points, steps, output[2])
    ctx.packed = (scalars, flags)
    ctx.has_plane_tv = plane_tv is not None


def _backward(ctx, grad_total, grad_terms, _grad_resid):
    densities, points, steps, resid = ctx.saved_tensors
    if grad_total is None:
        grad_total = torch.zeros((), dtype=densities.dtype, device=densities.device)
    grad, grad_plane = _ray_loss_backward_op(
        grad_total, grad_terms, densities, points, steps, resid, ctx.has_plane_tv, *ctx.packed
    )
    return grad, None, None, None, (grad_plane if ctx.has_plane_tv else None), None, None


_ray_loss_op.register_autograd(_backward, setup_context=_setup_context)
