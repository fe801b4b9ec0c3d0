"""``plane_tv``: the smoothness prior of feature planes, ``mean(Δ_H²) + mean(Δ_W²)``.

The public function validates, picks a backend with ``triton_dispatch`` and runs either the
PyTorch reference (CPU, ``backend="torch"``) or the Triton kernels: two launches for the value
(per-block partial sums, then one program that adds them, so the result does not depend on the
order atomics land in) and one pointwise launch for the gradient. Eager calls run them through an
``autograd.Function``; under ``torch.compile`` the same kernels run as the custom op
``tomo_kplanes::plane_tv`` (fake and autograd registrations included). Repeat calls with the same
kind of planes reuse a cached plan: validation and the backend choice run once per kind.
"""

from __future__ import annotations

import torch

from triton_dispatch import common_device, select_backend, uses_triton
from triton_dispatch.launch import PlanCache, call_key

from .reference import plane_tv_reference

__all__ = ["plane_tv", "plane_tv_reference"]

_SUPPORTED_DTYPES = (torch.float32, torch.float64)


def plane_tv(planes: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """``mean((p[..., 1:, :] − p[..., :-1, :])²) + mean((p[..., :, 1:] − p[..., :, :-1])²)``.

    Args:
        planes: ``(..., H, W)`` float32 or float64 planes with ``H, W >= 2`` (the model passes its
            ``(3T, C, H, W)`` parameters, contiguous or channels-last).
        backend: ``"auto"`` (default), ``"triton"``, ``"interpret"`` or ``"torch"``.

    Returns:
        A 0-d tensor in the planes' dtype, differentiable w.r.t. ``planes``; its gradient has the
        planes' strides.

    Raises:
        TypeError: not a float32/float64 tensor.
        ValueError: fewer than two dimensions, or ``H`` or ``W`` below 2.
    """
    if not torch.compiler.is_compiling():
        key = _key(planes, backend)
        if key is not None:
            return _PLANS.get(key, lambda: _plan(planes, backend))(planes)
    return _run(planes, _check(planes, backend))


_PLANS: PlanCache = PlanCache("tomo_kplanes.plane_tv")


def _key(planes, backend):
    # the strides tell a dense channels-last tensor from a strided view of the same shape
    stride = planes.stride() if isinstance(planes, torch.Tensor) else None
    return call_key((planes,), stride, backend, torch.is_grad_enabled())


def _check(planes, backend) -> str:
    if not isinstance(planes, torch.Tensor):
        raise TypeError(f"planes must be a torch.Tensor, got {type(planes).__name__}")
    if planes.dtype not in _SUPPORTED_DTYPES:
        raise TypeError(f"planes must be float32 or float64, got {planes.dtype}")
    if planes.dim() < 2 or planes.shape[-1] < 2 or planes.shape[-2] < 2:
        raise ValueError(
            f"planes must have shape (..., H, W) with H, W >= 2, got {tuple(planes.shape)}"
        )
    return select_backend(device=common_device((planes,), names=("planes",)), backend=backend)


def _dense(planes: torch.Tensor) -> bool:
    return planes.is_contiguous() or (
        planes.dim() == 4 and planes.is_contiguous(memory_format=torch.channels_last)
    )


def _kernel_path(planes: torch.Tensor, chosen: str) -> bool:
    return uses_triton(chosen) and planes.numel() > 0 and planes.numel() < 2**31


def _run(planes: torch.Tensor, chosen: str) -> torch.Tensor:
    if not _kernel_path(planes, chosen):
        return plane_tv_reference(planes)
    if not _dense(planes):
        planes = planes.contiguous()
    if torch.compiler.is_compiling():
        return _plane_tv_op(planes)
    return _EagerPlaneTV.apply(planes, _kernels(planes))


def _plan(planes: torch.Tensor, backend):
    chosen = _check(planes, backend)
    if not _kernel_path(planes, chosen) or not _dense(planes):
        return lambda planes: _run(planes, chosen)
    kernels = _kernels(planes)
    return lambda planes: _EagerPlaneTV.apply(planes, kernels)


def _kernels(planes: torch.Tensor):
    from .kernels import plan_for

    return plan_for(planes)


class _EagerPlaneTV(torch.autograd.Function):
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
def _plane_tv_op(planes: torch.Tensor) -> torch.Tensor:
    return _kernels(planes).forward(planes)


@_plane_tv_op.register_fake
def _(planes):
    return planes.new_empty(())


@torch.library.custom_op("tomo_kplanes::plane_tv_backward", mutates_args=())
def _plane_tv_backward_op(grad: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
    return _kernels(planes).grad(planes, grad)


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


_plane_tv_op.register_autograd(_backward, setup_context=_setup_context)
