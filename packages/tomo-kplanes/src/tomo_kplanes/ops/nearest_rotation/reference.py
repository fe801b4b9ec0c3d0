"""The specification of ``nearest_rotation`` (SVD; the CPU path and test oracle): projection of free
3×3 parameters onto SO(3) with a gradient that stays finite at the identity.

The projection is the polar factor ``R = U diag(1, 1, det(U Vᵀ)) Vᵀ`` of ``M = U S Vᵀ``. Autograd
through ``torch.linalg.svd`` divides by ``s_i² − s_j²``, which blows up exactly where the model
starts (``M ≈ I``, all singular values 1). The polar factor itself is smooth there: its derivative
only divides by ``s_i + s_j`` (``dR = U Ω Vᵀ``, ``Ω_ij = (B_ij − B_ji) / (s_i + s_j)``,
``B = Uᵀ dM V``), which this function implements as its backward.
"""

from __future__ import annotations

import torch


class _ProjectToSO3(torch.autograd.Function):
    @staticmethod
    def forward(ctx, matrices: torch.Tensor) -> torch.Tensor:
        u, s, vh = torch.linalg.svd(matrices)
        sign = torch.sign(torch.linalg.det(u @ vh))
        sign = torch.where(sign == 0, torch.ones_like(sign), sign)
        # fold the reflection into U and the last singular value so R = U' V'ᵀ exactly
        flip = torch.ones_like(s)
        flip[..., 2] = sign
        u = u * flip.unsqueeze(-2)
        s = s * flip
        rot = u @ vh
        ctx.save_for_backward(u, s, vh)
        return rot

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        u, s, vh = ctx.saved_tensors
        v = vh.transpose(-1, -2)
        a = u.transpose(-1, -2) @ grad @ v
        denom = s.unsqueeze(-1) + s.unsqueeze(-2)
        eps = torch.finfo(s.dtype).eps
        denom = torch.where(denom.abs() < eps, torch.full_like(denom, eps), denom)
        inner = (a - a.transpose(-1, -2)) / denom
        return u @ inner @ vh


def nearest_rotation_reference(matrices: torch.Tensor) -> torch.Tensor:
    """The nearest rotation (Frobenius norm) to each ``(T, 3, 3)`` matrix, differentiably.

    On CUDA ``torch.linalg.svd`` checks its solver's status on the host, which blocks the CPU once
    per call; the Triton path exists to avoid that in a training step. A matrix with a NaN or
    infinite entry gives an all-NaN rotation and no gradient, as on the Triton path (the SVD would
    refuse the whole batch, and checking first would cost a host synchronisation).
    """
    finite = torch.isfinite(matrices).flatten(-2).all(-1)[..., None, None]
    eye = torch.eye(3, dtype=matrices.dtype, device=matrices.device).expand_as(matrices)
    rot = _ProjectToSO3.apply(torch.where(finite, matrices, eye))
    return torch.where(finite, rot, torch.full_like(rot, float("nan")))
