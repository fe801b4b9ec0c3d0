"""The checks of a ``maxsim_inference_fp8`` call: batched operands, their scales and masks, one
device, and float8 operands on a GPU that multiplies them."""

from __future__ import annotations

import torch

from triton_dispatch import common_device, device_facts, select_backend

#: Compute capability from which ``tl.dot`` takes float8 operands.
FP8_MIN_CAPABILITY = (8, 9)
FP8_DTYPES = tuple(
    dt for dt in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if dt
)


def _batch(x: torch.Tensor, scale: torch.Tensor, name: str):
    if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3):
        raise ValueError(f"{name} must be [N, L, d] or [L, d]")
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"scale_{name} must be a float32 tensor")
    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(0)
        scale = scale.unsqueeze(0) if scale.dim() >= 1 and scale.numel() > 1 else scale
    if scale.numel() == 1 and scale.dim() < 2:
        scale = scale.reshape(())
    elif tuple(scale.shape) != tuple(x.shape[:2]):
        raise ValueError(
            f"scale_{name} must be a per-tensor scale (one element) or per-token "
            f"{tuple(x.shape[:2])}, got shape {tuple(scale.shape)}"
        )
    return x, scale.to(dtype=torch.float32).contiguous(), squeeze


def _mask(mask, shape, name):
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a bool tensor of shape {shape}, got {type(mask).__name__}")
    if mask.dim() == len(shape) - 1:
        mask = mask.unsqueeze(0)
    if mask.dtype != torch.bool or tuple(mask.shape) != shape:
        raise ValueError(f"{name} must be a bool tensor of shape {shape}")
    return mask


def resolve_call(Q, D, scale_Q, scale_D, q_mask, d_mask, backend):
    """Every metadata check: batched ``Q``, ``D``, their float32 scales on the device, masks, and
    the backend."""
    Q, sq, _ = _batch(Q, scale_Q, "Q")
    D, sd, _ = _batch(D, scale_D, "D")
    if Q.shape[-1] != D.shape[-1]:
        raise ValueError(
            f"Q and D must share the embedding dim; got {Q.shape[-1]} vs {D.shape[-1]}."
        )
    if Q.dtype != D.dtype:
        raise TypeError(f"Q and D must share one dtype, got {Q.dtype} and {D.dtype}")
    q_mask = _mask(q_mask, tuple(Q.shape[:2]), "q_mask")
    d_mask = _mask(d_mask, tuple(D.shape[:2]), "d_mask")
    # a one-element scale may stay on the host, like a Python number; anything else shares Q's device
    named = {"Q": Q, "D": D, "q_mask": q_mask, "d_mask": d_mask}
    named.update(
        (name, s)
        for name, s in (("scale_Q", sq), ("scale_D", sd))
        if s.dim() or s.device.type != "cpu"
    )
    device = common_device(named.values(), names=named.keys())
    # No value check here (it would cost a host synchronisation per call): a scale that is
    # negative, NaN or infinite makes the scores that use it NaN, on every backend.
    sq, sd = sq.to(device), sd.to(device)
    chosen = select_backend(device=device, backend=backend)
    is_fp8 = Q.dtype in FP8_DTYPES
    if chosen == "triton" and not is_fp8:
        raise TypeError(f"Q and D must be float8 tensors on CUDA, got {Q.dtype}")
    if chosen == "triton":
        found = device_facts(Q.device).capability
        if found < FP8_MIN_CAPABILITY:
            raise RuntimeError(
                f"FP8 MaxSim needs a GPU of compute capability >= 8.9 (float8 tl.dot); "
                f"{device_facts(Q.device).name} is {found[0]}.{found[1]}. Score the bf16 "
                "embeddings with late_interaction_kernels.maxsim instead."
            )
    return Q, D, sq, sd, q_mask, d_mask, chosen
