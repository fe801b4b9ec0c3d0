"""``tilted_plane_features_with_tv`` as the custom ops
``tomo_kplanes::tilted_plane_features_with_tv`` and its backward (fake and autograd registrations
included), and the same kernels as an eager autograd node."""

from __future__ import annotations

import torch


class EagerFeaturesWithTV(torch.autograd.Function):
    """The registered op's forward and backward for eager calls, without the custom-op dispatch."""

    @staticmethod
    def forward(ctx, points, rotations, planes, forward, backward, tv):
        ctx.save_for_backward(points, rotations, planes)
        ctx.backward_plans, ctx.tv = backward, tv
        # an output nobody differentiates arrives as None: no zero tensor made up for it
        ctx.set_materialize_grads(False)
        return forward(points, rotations, planes), tv.forward(planes)

    @staticmethod
    def backward(ctx, grad_features, grad_tv):
        from ..tilted_plane_features.backward import eager_input_grads

        points, rotations, planes = ctx.saved_tensors
        needs = ctx.needs_input_grad[:3]
        grad_planes = None
        if needs[2] and grad_tv is not None:
            grad_planes = ctx.tv.grad(planes, grad_tv)
        if grad_features is None:
            return None, None, grad_planes, None, None, None
        grads = eager_input_grads(
            ctx.backward_plans, needs, grad_features, points, rotations, planes, grad_planes
        )
        return (*grads, None, None, None)


@torch.library.custom_op("tomo_kplanes::tilted_plane_features_with_tv", mutates_args=())
def _features_with_tv_op(
    points: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    from ..plane_tv.kernels import plan_for
    from ..tilted_plane_features.forward import forward_triton

    return forward_triton(points, rotations, planes), plan_for(planes).forward(planes)


@_features_with_tv_op.register_fake
def _(points, rotations, planes):
    features = planes.new_empty((points.shape[0], rotations.shape[0] * planes.shape[1]))
    return features, planes.new_empty(())


@torch.library.custom_op("tomo_kplanes::tilted_plane_features_with_tv_backward", mutates_args=())
def _features_with_tv_backward_op(
    grad_out: torch.Tensor,
    grad_tv: torch.Tensor,
    points: torch.Tensor,
    rotations: torch.Tensor,
    planes: torch.Tensor,
    coordinate_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from ..plane_tv.kernels import plan_for
    from ..tilted_plane_features.backward import backward_triton

    grad_planes = plan_for(planes).grad(planes, grad_tv)
    return backward_triton(grad_out, points, rotations, planes, coordinate_grad, grad_planes)


@_features_with_tv_backward_op.register_fake
def _(grad_out, grad_tv, points, rotations, planes, coordinate_grad):
    return (
        points.new_empty(points.shape),
        rotations.new_empty(rotations.shape),
        torch.empty_like(planes),
    )


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad_out, grad_tv):
    from ..tilted_plane_features.backward import needed

    points, rotations, planes = ctx.saved_tensors
    need_points, need_rotations, _ = ctx.needs_input_grad
    grads = torch.ops.tomo_kplanes.tilted_plane_features_with_tv_backward(
        grad_out.contiguous(), grad_tv, points, rotations, planes,
        bool(need_points or need_rotations),
    )  # fmt: skip
    return needed(grads, ctx.needs_input_grad)


_features_with_tv_op.register_autograd(_backward, setup_context=_setup_context)
