"""``nearest_rotation``: project free 3×3 matrices onto SO(3) (the model's learned rotations).

The public function validates, picks a backend with ``triton_dispatch`` and runs either the SVD
reference (CPU, ``backend="torch"``) or one tiny Triton program through the custom op
``tomo_kplanes::nearest_rotation``. The Triton path exists for the training step on CUDA, where the
SVD's host-side status check would block the CPU every step; see ``kernel.py`` for the method.
Eager calls run the kernels through an ``autograd.Function`` (no custom-op dispatch) and reuse a
plan per kind of call, so a training step pays about two launches for it.
"""

from __future__ import annotations

import torch

from triton_dispatch import common_device, select_backend, uses_triton
from triton_dispatch.launch import PlanCache, call_key

from .reference import nearest_rotation_reference

__all__ = ["nearest_rotation", "nearest_rotation_reference"]


def nearest_rotation(matrices: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """The nearest rotation (Frobenius norm) to each ``(..., 3, 3)`` matrix, differentiably.

    ``R = U diag(1, 1, det(U Vᵀ)) Vᵀ`` for ``M = U S Vᵀ``; the gradient stays finite at the
    identity (it divides by ``s_i + s_j``, not ``s_i² − s_j²``). Matrices must be non-singular; one
    with a NaN or infinite entry gives an all-NaN rotation on every backend.

    Args:
        matrices: ``(..., 3, 3)`` float32 or float64.
        backend: ``"auto"`` (default), ``"triton"``, ``"interpret"`` or ``"torch"`` (SVD).

    Raises:
        TypeError: not a float32/float64 tensor.
        ValueError: the last two dimensions are not ``(3, 3)``.
    """
    if not torch.compiler.is_compiling() and isinstance(matrices, torch.Tensor):
        key = call_key((matrices,), matrices.stride(), backend, torch.is_grad_enabled())
        if key is not None:
            return _PLANS.get(key, lambda: _plan(matrices, backend))(matrices)
    chosen = _check(matrices, backend)
    flat = matrices.reshape(-1, 3, 3)
    if not uses_triton(chosen):
        return nearest_rotation_reference(flat).reshape(matrices.shape)
    rot, _sym = torch.ops.tomo_kplanes.nearest_rotation(flat)
    return rot.reshape(matrices.shape)


_PLANS: PlanCache = PlanCache("tomo_kplanes.nearest_rotation")


def _check(matrices, backend) -> str:
    if not isinstance(matrices, torch.Tensor):
        raise TypeError(f"matrices must be a torch.Tensor, got {type(matrices).__name__}")
    if matrices.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"matrices must be float32 or float64, got {matrices.dtype}")
    if matrices.dim() < 2 or matrices.shape[-2:] != (3, 3):
        raise ValueError(f"matrices must have shape (..., 3, 3), got {tuple(matrices.shape)}")
    return select_backend(device=common_device((matrices,), names=("matrices",)), backend=backend)


def _plan(matrices: torch.Tensor, backend):
    chosen = _check(matrices, backend)
    shape = matrices.shape
    if not uses_triton(chosen):
        return lambda m: nearest_rotation_reference(m.reshape(-1, 3, 3)).reshape(shape)
    from .kernel import rotation_plan

    kernels = rotation_plan(matrices.reshape(-1, 3, 3))

    def run(m):
        return _EagerRotation.apply(m.reshape(-1, 3, 3), kernels).reshape(shape)

    return run


class _EagerRotation(torch.autograd.Function):
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
