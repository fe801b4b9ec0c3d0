"""``tilted_plane_features_with_tv``: the features of ``tilted_plane_features`` and the
``plane_tv`` of the same planes, from one autograd node.

A training step differentiates both with respect to the planes. Run apart, the features' backward
fills a zero buffer for its atomics, the plane TV's backward writes a second plane-sized gradient,
and autograd adds the two: a memset, then an add that reads two plane-sized tensors and writes one.
Here the plane TV's backward kernel writes its gradient into the buffer and the features' backward
adds its atomics on top, so the planes' gradient costs one plane-sized write instead.

The kernels are the two ops' own. The values are theirs; the planes' gradient is theirs up to the
order of the fp32 additions. Where the fold cannot apply (the PyTorch backend, a plane layout one
of the two kernels would copy first) it is the two ops called one after the other. Eager calls run
an ``autograd.Function`` over cached plans; under ``torch.compile`` the custom op
``tomo_kplanes::tilted_plane_features_with_tv`` (fake and autograd registrations included).
"""

from __future__ import annotations

import torch

from triton_dispatch import uses_triton
from triton_dispatch.launch import PlanCache

from ..plane_tv import _check as _check_planes_for_tv
from ..plane_tv import _dense, _kernel_path, plane_tv
from ..tilted_plane_features import _check as _check_features
from ..tilted_plane_features import _key, tilted_plane_features
from .reference import tilted_plane_features_with_tv_reference

__all__ = ["tilted_plane_features_with_tv", "tilted_plane_features_with_tv_reference"]


def tilted_plane_features_with_tv(
    points: torch.Tensor,
    rotations: torch.Tensor,
    planes: torch.Tensor,
    *,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tilted_plane_features(points, rotations, planes), plane_tv(planes))`` as one op.

    Args and errors: those of the two ops (planes ``(3T, C, H, W)`` with ``H, W >= 2``).

    Returns:
        The ``(N, T·C)`` features and the 0-d plane TV, both differentiable; the planes' gradient
        is the sum of the two ops' gradients, made without a zero fill or an extra add.
    """
    if not torch.compiler.is_compiling():
        key = _key(points, rotations, planes, backend)
        if key is not None:
            plan = _PLANS.get(key, lambda: _plan(points, rotations, planes, backend))
            return plan(points, rotations, planes)
    chosen = _check(points, rotations, planes, backend)
    if not uses_triton(chosen):
        return tilted_plane_features_with_tv_reference(points, rotations, planes)
    if not _folds(planes, chosen):
        return _apart(points, rotations, planes, backend)
    return torch.ops.tomo_kplanes.tilted_plane_features_with_tv(points, rotations, planes)


_PLANS: PlanCache = PlanCache("tomo_kplanes.tilted_plane_features_with_tv")


def _check(points, rotations, planes, backend) -> str:
    chosen = _check_features(points, rotations, planes, backend)
    _check_planes_for_tv(planes, backend)  # H, W >= 2, refused as plane_tv refuses them
    return chosen


def _folds(planes: torch.Tensor, chosen: str) -> bool:
    # both kernels read and write the planes' own dense layout: the TV's gradient is then a buffer
    # the features' backward can add into as it is
    return _kernel_path(planes, chosen) and _dense(planes)


def _apart(points, rotations, planes, backend):
    return (
        tilted_plane_features(points, rotations, planes, backend=backend),
        plane_tv(planes, backend=backend),
    )


def _plan(points, rotations, planes, backend):
    chosen = _check(points, rotations, planes, backend)
    if not uses_triton(chosen):
        return tilted_plane_features_with_tv_reference
    if not _folds(planes, chosen):
        return lambda points, rotations, planes: _apart(points, rotations, planes, backend)
    from ..plane_tv.kernels import plan_for
    from ..tilted_plane_features.backward import backward_plan, compile_backward_ahead
    from ..tilted_plane_features.forward import forward_plan

    forward = forward_plan(points, rotations, planes)
    backward = {need: backward_plan(points, rotations, planes, need) for need in (False, True)}
    compile_backward_ahead(backward, points, rotations, planes)
    tv = plan_for(planes)

    def run(points, rotations, planes):
        return _EagerFeaturesWithTV.apply(points, rotations, planes, forward, backward, tv)

    return run


class _EagerFeaturesWithTV(torch.autograd.Function):
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
