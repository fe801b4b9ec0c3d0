"""``tilted_plane_features``: rotated tri-plane (K-Planes / TILTED) feature interpolation.

The public function validates its inputs, picks a backend with ``triton_dispatch`` and either runs
the PyTorch reference (``grid_sample``; CPU, MPS, ``backend="torch"``) or the fused Triton kernels
through the custom op ``tomo_kplanes::tilted_plane_features`` (with a fake implementation and an
autograd formula, so it traces under ``torch.compile(fullgraph=True)``). Eager calls run the same
kernels through an ``autograd.Function`` (a custom op's dispatch costs more host time than its
launches), and a repeat call with the same kind of inputs reuses a cached plan: validation, the
backend choice and the launch arguments are resolved once per kind. See ``reference.py`` for the
axis conventions.
"""

from __future__ import annotations

import torch

from triton_dispatch import common_device, select_backend, uses_triton
from triton_dispatch.launch import PlanCache, call_key

from .reference import PLANE_AXES, rotate_points, tilted_plane_features_reference

__all__ = [
    "PLANE_AXES",
    "rotate_points",
    "tilted_plane_features",
    "tilted_plane_features_reference",
]

_SUPPORTED_DTYPES = (torch.float32, torch.float64)


def _validate(points: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor) -> None:
    for name, t in (("points", points), ("rotations", rotations), ("planes", planes)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if points.dim() != 2 or points.shape[1] != 3:
        raise ValueError(f"points must have shape (N, 3), got {tuple(points.shape)}")
    if rotations.dim() != 3 or rotations.shape[1:] != (3, 3) or rotations.shape[0] < 1:
        raise ValueError(
            f"rotations must have shape (T, 3, 3) with T >= 1, got {tuple(rotations.shape)}"
        )
    t = rotations.shape[0]
    if planes.dim() != 4 or planes.shape[0] != 3 * t:
        raise ValueError(
            f"planes must have shape (3T, C, H, W) = ({3 * t}, C, H, W) for T={t} rotations, "
            f"got {tuple(planes.shape)}"
        )
    if min(planes.shape[1:]) < 1:
        raise ValueError(f"planes needs C, H, W >= 1, got {tuple(planes.shape)}")
    if not (points.dtype == rotations.dtype == planes.dtype):
        raise TypeError(
            "points, rotations and planes must share one dtype, got "
            f"{points.dtype}, {rotations.dtype}, {planes.dtype}"
        )
    # checked here, before the backend is chosen, so that a call is accepted or refused the same
    # way on every device and backend
    if planes.dtype not in _SUPPORTED_DTYPES:
        raise TypeError(
            f"tilted_plane_features takes float32 or float64 inputs, got {planes.dtype}; "
            "cast points, rotations and planes (e.g. .float()) first"
        )


def tilted_plane_features(
    points: torch.Tensor,
    rotations: torch.Tensor,
    planes: torch.Tensor,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Features ``(N, T·C)`` of ``points`` sampled from ``T`` rotated triplets of feature planes.

    For each rotation ``t`` the points are rotated (``q = R_t p``), the planes ``3t`` (XY), ``3t+1``
    (ZX) and ``3t+2`` (YZ) are sampled bilinearly (``align_corners=True``, border clamping) and the
    three samples multiplied; the results are concatenated over rotations (column ``t·C + c``).

    Args:
        points: ``(N, 3)`` coordinates ``(x, y, z)`` in ``[-1, 1]`` (outside is clamped).
        rotations: ``(T, 3, 3)`` matrices (any matrices work; the model passes rotations).
        planes: ``(3T, C, H, W)`` feature planes; channels-last memory makes the kernel's channel
            reads contiguous.
        backend: ``"auto"`` (default), ``"triton"``, ``"interpret"`` or ``"torch"``.

    Returns:
        ``(N, T·C)`` in the inputs' dtype. Differentiable w.r.t. all three inputs; the gradient
        w.r.t. a coordinate is zero where the border clamp is active, as in ``grid_sample``.
        Where a rotated point ``R_t p`` has a NaN or infinite coordinate, its ``C`` features for
        rotation ``t`` are NaN and the pair adds nothing to any gradient (on every backend).

    Raises:
        TypeError: non-float, mismatched, or other than float32/float64 dtypes (on every backend).
        ValueError: wrong shapes or tensors on different devices.
    """
    if not torch.compiler.is_compiling():
        key = _key(points, rotations, planes, backend)
        if key is not None:
            plan = _PLANS.get(key, lambda: _plan(points, rotations, planes, backend))
            return plan(points, rotations, planes)
    if not uses_triton(_check(points, rotations, planes, backend)):
        return tilted_plane_features_reference(points, rotations, planes)
    return torch.ops.tomo_kplanes.tilted_plane_features(points, rotations, planes)


_PLANS: PlanCache = PlanCache("tomo_kplanes.tilted_plane_features")


def _key(points, rotations, planes, backend):
    tensors = (points, rotations, planes)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    # the kernels' plans depend on every stride (channels-last planes are not "contiguous")
    strides = tuple(t.stride() for t in tensors)
    return call_key(tensors, strides, backend, torch.is_grad_enabled())


def _check(points, rotations, planes, backend) -> str:
    _validate(points, rotations, planes)
    device = common_device((points, rotations, planes), names=("points", "rotations", "planes"))
    return select_backend(device=device, backend=backend)


def _plan(points, rotations, planes, backend):
    if not uses_triton(_check(points, rotations, planes, backend)):
        return tilted_plane_features_reference
    from .backward import backward_plan, compile_backward_ahead
    from .forward import forward_plan

    forward = forward_plan(points, rotations, planes)
    backward = {need: backward_plan(points, rotations, planes, need) for need in (False, True)}
    compile_backward_ahead(backward, points, rotations, planes)

    def run(points, rotations, planes):
        return _EagerFeatures.apply(points, rotations, planes, forward, backward)

    return run


class _EagerFeatures(torch.autograd.Function):
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
