"""Argument checks shared by the ops built on MaxSim (and the cross-rank scoring): token tensors,
matching pairs, masks, and the backend a call runs on."""

from __future__ import annotations

import torch

from triton_dispatch import common_device, select_backend, uses_triton

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_tensor(name: str, t, rank: int | tuple[int, ...], layout_text: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {layout_text}, got {type(t).__name__}")
    ranks = (rank,) if isinstance(rank, int) else rank
    if t.dim() not in ranks:
        raise ValueError(f"{name} must be {layout_text}; got shape {tuple(t.shape)}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype}")


def check_pair(Q: torch.Tensor, D: torch.Tensor, qn: str = "Q", dn: str = "D") -> None:
    if Q.dtype != D.dtype:
        raise TypeError(f"{qn} and {dn} must share a dtype; got {Q.dtype} and {D.dtype}")
    if Q.shape[-1] != D.shape[-1]:
        raise ValueError(
            f"{qn} and {dn} must share the embedding size d; got {qn}.shape[-1]={Q.shape[-1]} "
            f"and {dn}.shape[-1]={D.shape[-1]}"
        )


def check_mask(name: str, mask, shape: tuple[int, ...]) -> torch.Tensor | None:
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a bool tensor of shape {shape}, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor (True = valid token), got {mask.dtype}")
    if tuple(mask.shape) != tuple(shape):
        # "must be" too: 0.4.5's wording, which callers' error matching looks for
        raise ValueError(
            f"{name} must have shape {tuple(shape)}, got {tuple(mask.shape)}: {name} must be "
            "one flag per token"
        )
    return mask.contiguous()


def backend_for(tensors, names, backend: str | None) -> str:
    device = common_device(tensors, names=names)
    chosen = "triton" if uses_triton(select_backend(device=device, backend=backend)) else "torch"
    # float64 has no Triton dot worth having: the reference path computes it exactly
    return "torch" if tensors[0].dtype == torch.float64 else chosen
