"""``nearest_rotation``: validation, the backend choice and the plan cache of eager calls."""

from __future__ import annotations

import torch

from triton_dispatch import common_device, select_backend, uses_triton
from triton_dispatch.launch import PlanCache, call_key

from .op import EagerRotation
from .reference import nearest_rotation_reference


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
        return EagerRotation.apply(m.reshape(-1, 3, 3), kernels).reshape(shape)

    return run
