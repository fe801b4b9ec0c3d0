"""``plane_tv``: the backend choice, the layouts the kernels take and the plan cache of eager
calls."""

from __future__ import annotations

import torch

from triton_dispatch import uses_triton
from triton_dispatch.launch import PlanCache, call_key

from .op import EagerPlaneTV, kernels_for, plane_tv_op
from .reference import plane_tv_reference
from .validation import check_planes


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
    return _run(planes, check_planes(planes, backend))


_PLANS: PlanCache = PlanCache("tomo_kplanes.plane_tv")


def _key(planes, backend):
    # the strides tell a dense channels-last tensor from a strided view of the same shape
    stride = planes.stride() if isinstance(planes, torch.Tensor) else None
    return call_key((planes,), stride, backend, torch.is_grad_enabled())


def dense(planes: torch.Tensor) -> bool:
    return planes.is_contiguous() or (
        planes.dim() == 4 and planes.is_contiguous(memory_format=torch.channels_last)
    )


def kernel_path(planes: torch.Tensor, chosen: str) -> bool:
    return uses_triton(chosen) and planes.numel() > 0 and planes.numel() < 2**31


def _run(planes: torch.Tensor, chosen: str) -> torch.Tensor:
    if not kernel_path(planes, chosen):
        return plane_tv_reference(planes)
    if not dense(planes):
        planes = planes.contiguous()
    if torch.compiler.is_compiling():
        return plane_tv_op(planes)
    return EagerPlaneTV.apply(planes, kernels_for(planes))


def _plan(planes: torch.Tensor, backend):
    chosen = check_planes(planes, backend)
    if not kernel_path(planes, chosen) or not dense(planes):
        return lambda planes: _run(planes, chosen)
    kernels = kernels_for(planes)
    return lambda planes: EagerPlaneTV.apply(planes, kernels)
