"""``nearest_rotation`` as the custom ops ``tomo_kplanes::nearest_rotation`` and its backward
(fake and autograd registrations included), and the same kernels as an eager autograd node."""

from __future__ import annotations

import torch


class EagerRotation(torch.autograd.Function):
    """The registered op's forward and backward for eager calls, without the custom-op dispatch;
    the symmetric factor stays internal, so no gradient is made up for it."""

    @staticmethod
    def forward(ctx, flat, kernels):
        rot, sym = kernels.forward(flat)
        ctx.save_for_backward(rot, sym)
        ctx.kernels = kernels
        return rot

    @staticmethod
    def backward(ctx, grad_rot):
        rot, sym = ctx.saved_tensors
        return ctx.kernels.backward(grad_rot.contiguous(), rot, sym), None


@torch.library.custom_op("tomo_kplanes::nearest_rotation", mutates_args=())
def _rotation_op(matrices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from .kernel import nearest_rotation_triton

    return nearest_rotation_triton(matrices)


@_rotation_op.register_fake
def _(matrices):
    return matrices.new_empty(matrices.shape), matrices.new_empty(matrices.shape)


@torch.library.custom_op("tomo_kplanes::nearest_rotation_backward", mutates_args=())
def _rotation_backward_op(grad: torch.Tensor, rot: torch.Tensor, sym: torch.Tensor) -> torch.Tensor:
    from .kernel import nearest_rotation_backward_triton

    return nearest_rotation_backward_triton(grad, rot, sym)


@_rotation_backward_op.register_fake
def _(grad, rot, sym):
    return rot.new_empty(rot.shape)


def _setup_context(ctx, inputs, output) -> None:
    rot, sym = output
    ctx.mark_non_differentiable(sym)
    ctx.set_materialize_grads(False)  # no zeros made up for the unused factor's gradient
    ctx.save_for_backward(rot, sym)


def _backward(ctx, grad_rot, _grad_sym):
    rot, sym = ctx.saved_tensors
    if grad_rot is None:
        return None
    # the symmetric factor is an internal by-product: the public function never returns it
    return torch.ops.tomo_kplanes.nearest_rotation_backward(grad_rot.contiguous(), rot, sym)


_rotation_op.register_autograd(_backward, setup_context=_setup_context)
