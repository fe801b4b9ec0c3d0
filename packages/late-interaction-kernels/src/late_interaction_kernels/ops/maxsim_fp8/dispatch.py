"""``maxsim_inference_fp8``: 2-D operands as batches of one, then its declaration (:mod:`.op`):
the kernels on CUDA, the dequantised tokens scored in PyTorch elsewhere."""

from __future__ import annotations

import torch

from .op import FP8


def maxsim_inference_fp8(
    Q: torch.Tensor,
    D: torch.Tensor,
    *,
    scale_Q: torch.Tensor,
    scale_D: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """MaxSim scores of quantised queries and documents (inference only).

    Args:
        Q: ``(Nq, Lq, d)`` or ``(Lq, d)``, ``torch.float8_e4m3fn`` (or ``float8_e5m2``).
        D: ``(Nd, Ld, d)`` or ``(Ld, d)`` in the same dtype.
        scale_Q, scale_D: float32, one element (per tensor) or ``(N, L)`` (per token), as
            returned by the ``quantize_fp8_*`` functions. A scale that is negative, NaN or
            infinite makes every score that uses it NaN (values are not checked: that would
            synchronise with the host on every call).
        q_mask, d_mask: bool masks, True = valid token (rules of ``maxsim``).
        backend: keyword-only addition: ``"triton"``, ``"interpret"`` or ``"torch"``. The
            interpreter has no 8-bit floats: there the kernel takes fp16/fp32 stand-ins and
            8-bit inputs are scored in PyTorch.

    Returns:
        float32 ``(Nq, Nd)``, squeezed for 2-D inputs.

    Raises:
        RuntimeError: CUDA tensors on a GPU below compute capability 8.9 (no float8 ``tl.dot``).
    """
    for name, x in (("Q", Q), ("D", D)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a tensor (N, L, d) or (L, d), got {type(x).__name__}")
    q_single, d_single = Q.dim() == 2, D.dim() == 2
    if q_single:
        Q, scale_Q = Q.unsqueeze(0), _token_scale(scale_Q)
    if d_single:
        D, scale_D = D.unsqueeze(0), _token_scale(scale_D)
    if not Q.is_cpu:  # a one-element scale may stay on the host, like a Python number
        scale_Q, scale_D = _on_device(scale_Q, Q), _on_device(scale_D, D)
    if q_mask is not None or d_mask is not None:
        q_mask, d_mask = _mask(q_mask, "q_mask"), _mask(d_mask, "d_mask")
    scores = FP8(Q, D, scale_Q, scale_D, q_mask, d_mask, backend=backend)
    if q_single:
        scores = scores.squeeze(0)
    return scores.squeeze(-1) if d_single else scores


def _token_scale(scale):
    """The per-token scale ``(L,)`` of one sequence as ``(1, L)``."""
    if isinstance(scale, torch.Tensor) and scale.dim() >= 1 and scale.numel() > 1:
        return scale.unsqueeze(0)
    return scale


def _on_device(scale, x: torch.Tensor):
    """A one-element scale on the host moved to ``x``'s device."""
    if isinstance(scale, torch.Tensor) and scale.is_cpu and scale.dim() < 2 and scale.numel() == 1:
        return scale.to(x.device)
    return scale


def _mask(mask, name: str):
    """A mask ``(L,)`` of one sequence as ``(1, L)``."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a bool tensor, got {type(mask).__name__}")
    return mask.unsqueeze(0) if mask.dim() == 1 else mask
