"""``plane_tv`` as the custom ops ``tomo_kplanes::plane_tv`` and its backward (fake and autograd
registrations included), and the same kernels as an eager autograd node."""

from __future__ import annotations

import torch


def kernels_for(planes: torch.Tensor):
    from .kernels import plan_for

    return plan_for(planes)


class EagerPlaneTV(torch.autograd.Function):
    """The registered op's forward and backward without the custom-op dispatch (whose host cost
    is several times that of the two launches)."""

    @staticmethod
    def forward(ctx, planes, kernels):
        ctx.save_for_backward(planes)
        ctx.kernels = kernels
        return kernels.forward(planes)

    @staticmethod
    def backward(ctx, grad):
        (planes,) = ctx.saved_tensors
        return ctx.kernels.grad(planes, grad), None


@torch.library.custom_op("tomo_kplanes::plane_tv", mutates_args=())
def plane_tv_op(planes: torch.Tensor) -> torch.Tensor:
    return kernels_for(planes).forward(planes)


@plane_tv_op.register_fake
def _(planes):
    return planes.new_empty(())


@torch.library.custom_op("tomo_kplanes::plane_tv_backward", mutates_args=())
def _plane_tv_backward_op(grad: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
    return kernels_for(planes).grad(planes, grad)


@_plane_tv_backward_op.register_fake
def _(grad, planes):
    return torch.empty_strided(
        planes.shape, planes.stride(), dtype=planes.dtype, device=planes.device
    )


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])


def _backward(ctx, grad):
    (planes,) = ctx.saved_tensors
    return _plane_tv_backward_op(grad, planes)


plane_tv_op.register_autograd(_backward, setup_context=_setup_context)
