"""``ray_loss`` as the custom ops ``tomo_kplanes::ray_loss`` and its backward (fake and autograd
registrations included), and the same kernels as an eager autograd node."""

from __future__ import annotations

import torch

from triton_dispatch.compile_ahead import backward_follows


def kernels_for(tensors, settings):
    from .kernels import plan_for

    densities, points, _, _, plane_tv = tensors
    b, s = points.shape[0], points.shape[1]
    taps = (densities.shape[0] - b * s) // 4
    return plan_for(
        b, s, taps, points.stride(), densities.dtype, densities.device, plane_tv is not None,
        *settings, backward=backward_follows(densities, plane_tv),
    )  # fmt: skip


class EagerRayLoss(torch.autograd.Function):
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


def pack_settings(settings) -> tuple[list[float], list[bool]]:
    """The settings as the custom ops take them: ``[tv_step, volume_tv_weight, plane_tv_weight,
    shrinkage]`` and ``[positivity, mask_out_of_bounds]``."""
    tv_step, volume_w, plane_w, positivity, shrinkage, mask = settings
    return [tv_step, volume_w, plane_w, shrinkage], [positivity, mask]


def _unpack(scalars, flags) -> tuple:
    tv_step, volume_w, plane_w, shrinkage = scalars
    return (tv_step, volume_w, plane_w, flags[0], shrinkage, flags[1])


@torch.library.custom_op("tomo_kplanes::ray_loss", mutates_args=())
def ray_loss_op(
    densities: torch.Tensor,
    points: torch.Tensor,
    steps: torch.Tensor,
    target: torch.Tensor,
    plane_tv: torch.Tensor | None,
    scalars: list[float],
    flags: list[bool],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tensors = (densities, points, steps, target, plane_tv)
    return kernels_for(tensors, _unpack(scalars, flags)).forward(*tensors)


@ray_loss_op.register_fake
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
    kernels = kernels_for((densities, points, steps, None, plane_tv), _unpack(scalars, flags))
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


ray_loss_op.register_autograd(_backward, setup_context=_setup_context)
