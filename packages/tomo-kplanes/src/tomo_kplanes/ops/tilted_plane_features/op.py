"""``tilted_plane_features`` as the custom ops ``tomo_kplanes::tilted_plane_features`` and its
backward (fake and autograd registrations included), and the same kernels as an eager autograd
node."""

from __future__ import annotations

import torch


class EagerFeatures(torch.autograd.Function):
    """The registered op's forward and backward for eager calls, without the custom-op dispatch."""

    @staticmethod
    def forward(ctx, points, rotations, planes, forward, backward):
        ctx.save_for_backward(points, rotations, planes)
        ctx.backward_plans = backward
        return forward(points, rotations, planes)

    @staticmethod
    def backward(ctx, grad_out):
        from .backward import eager_input_grads

        points, rotations, planes = ctx.saved_tensors
        grads = eager_input_grads(
            ctx.backward_plans, ctx.needs_input_grad[:3], grad_out, points, rotations, planes
        )
        return (*grads, None, None)


@torch.library.custom_op("tomo_kplanes::tilted_plane_features", mutates_args=())
def _features_op(
    points: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor
) -> torch.Tensor:
    from .forward import forward_triton

    return forward_triton(points, rotations, planes)


@_features_op.register_fake
def _(points: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
    return planes.new_empty((points.shape[0], rotations.shape[0] * planes.shape[1]))


@torch.library.custom_op("tomo_kplanes::tilted_plane_features_backward", mutates_args=())
def _features_backward_op(
    grad_out: torch.Tensor,
    points: torch.Tensor,
    rotations: torch.Tensor,
    planes: torch.Tensor,
    coordinate_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from .backward import backward_triton

    return backward_triton(grad_out, points, rotations, planes, coordinate_grad)


@_features_backward_op.register_fake
def _(grad_out, points, rotations, planes, coordinate_grad):
    return (
        points.new_empty(points.shape),
        rotations.new_empty(rotations.shape),
        torch.empty_like(planes),
    )


def _setup_context(ctx, inputs, output) -> None:
    points, rotations, planes = inputs
    ctx.save_for_backward(points, rotations, planes)


def _backward(ctx, grad_out):
    from .backward import needed

    points, rotations, planes = ctx.saved_tensors
    need_points, need_rotations, _ = ctx.needs_input_grad
    grads = torch.ops.tomo_kplanes.tilted_plane_features_backward(
        grad_out.contiguous(), points, rotations, planes, bool(need_points or need_rotations)
    )
    return needed(grads, ctx.needs_input_grad)


_features_op.register_autograd(_backward, setup_context=_setup_context)
