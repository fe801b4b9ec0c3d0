"""A tiny op that exercises the whole stack: dispatch, an autotuned Triton kernel with atomic
accumulation (``reset_to_zero``), shared-memory pruning, and the PyTorch reference.

``column_sums(x)`` returns ``x.sum(0)`` for a 2-D tensor, accumulated in fp32. It exists so tests and
the GPU runner can check that a machine's Triton setup works end to end; it is not a public op.
"""

from __future__ import annotations

import torch

from .autotune import (
    autotune,
    config_space,
    padded_dim,
    prune_by_shared_memory,
    shape_bucket,
    tile_shared_memory,
)
from .backend import select_backend, uses_triton


def column_sums_reference(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64 if x.dtype == torch.float64 else torch.float32).sum(0)


_kernel = None


def _build_kernel():
    import triton
    import triton.language as tl

    def smem(meta, num_stages, args):
        return tile_shared_memory(
            (meta["BLOCK_R"], meta["BLOCK_C"]), element_size=4, num_stages=num_stages
        )

    @autotune(
        config_space({"BLOCK_R": [16, 64], "BLOCK_C": [32, 128]}, num_warps=[2, 4]),
        key=["ROWS_BUCKET", "COLS_PADDED"],
        prune=prune_by_shared_memory(smem),
        reset_to_zero=["out_ptr"],
    )
    @triton.jit
    def column_sums_kernel(
        x_ptr,
        out_ptr,
        rows,
        cols,
        stride_r,
        stride_c,
        ROWS_BUCKET: tl.constexpr,
        COLS_PADDED: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        pid_r = tl.program_id(0)
        pid_c = tl.program_id(1)
        r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = (r[:, None] < rows) & (c[None, :] < cols)
        tile = tl.load(x_ptr + r[:, None] * stride_r + c[None, :] * stride_c, mask=mask, other=0.0)
        tl.atomic_add(out_ptr + c, tl.sum(tile.to(tl.float32), axis=0), mask=c < cols)

    return column_sums_kernel


def column_sums(x: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """Column sums of a 2-D float tensor, in fp32 (fp64 for fp64 input on the torch backend)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (rows, cols), got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a float tensor, got {x.dtype}")
    chosen = select_backend(x, backend=backend)
    if not uses_triton(chosen) or x.dtype == torch.float64:
        return column_sums_reference(x)
    global _kernel
    if _kernel is None:
        _kernel = _build_kernel()
    rows, cols = x.shape
    out = torch.zeros(cols, device=x.device, dtype=torch.float32)
    if x.numel() == 0:
        return out
    grid = lambda meta: (
        (rows + meta["BLOCK_R"] - 1) // meta["BLOCK_R"],
        (cols + meta["BLOCK_C"] - 1) // meta["BLOCK_C"],
    )
    _kernel[grid](
        x,
        out,
        rows,
        cols,
        x.stride(0),
        x.stride(1),
        ROWS_BUCKET=shape_bucket(rows, minimum=16, maximum=1 << 16),
        COLS_PADDED=padded_dim(cols),
    )
    return out
