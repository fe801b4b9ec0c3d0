"""The checks of a ``maxsim_from_hidden`` call: shapes, one dtype, masks, the chunk size and one
device."""

from __future__ import annotations

import torch

from triton_dispatch import common_device


def _shape(x) -> str:
    return (
        f"{x.dtype} tensor of shape {tuple(x.shape)}"
        if isinstance(x, torch.Tensor)
        else type(x).__name__
    )


def validate(Q, H_d, W, b, d_mask, q_mask, chunk_size) -> None:
    for name, t, rank, layout in (
        ("Q", Q, 3, "(Nq, Lq, d)"),
        ("H_d", H_d, 3, "(Nd, Ld, h)"),
        ("W", W, 2, "(h, d)"),
    ):
        if not isinstance(t, torch.Tensor) or t.dim() != rank or not t.is_floating_point():
            raise ValueError(f"{name} must be a floating {layout} tensor, got {_shape(t)}")
    if H_d.shape[-1] != W.shape[0]:
        raise ValueError(
            f"W must be (h, d) with h = H_d.shape[-1] = {H_d.shape[-1]}, got {tuple(W.shape)}"
        )
    if Q.shape[-1] != W.shape[1]:
        raise ValueError(f"Q has width {Q.shape[-1]} but W projects to d = {W.shape[1]}")
    if b is not None and (not isinstance(b, torch.Tensor) or tuple(b.shape) != (W.shape[1],)):
        raise ValueError(f"b must be a ({W.shape[1]},) tensor, got {_shape(b)}")
    dtypes = {t.dtype for t in (Q, H_d, W, b) if t is not None}
    if len(dtypes) != 1:
        raise TypeError(f"Q, H_d, W and b must share one dtype, got {sorted(map(str, dtypes))}")
    for name, mask, shape in (("d_mask", d_mask, H_d.shape[:2]), ("q_mask", q_mask, Q.shape[:2])):
        if mask is not None and (
            not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != shape
        ):
            raise ValueError(
                f"{name} must be a bool tensor of shape {tuple(shape)}, got {_shape(mask)}"
            )
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    common_device([Q, H_d, W, b, d_mask, q_mask], names=["Q", "H_d", "W", "b", "d_mask", "q_mask"])
