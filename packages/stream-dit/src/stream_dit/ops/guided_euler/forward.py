"""Triton kernel: classifier-free guidance combine and Euler step in one pass over memory.

One program handles one block of one row's ``T·C`` elements; row indices and per-row scalars come
from small device tensors, so a tick's guided rows are one launch whatever their lengths.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _guided_euler_kernel(
    state_ptr,
    vel_ptr,
    rows_ptr,
    params_ptr,
    n_rows,
    state_row_stride,
    vel_row_stride,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0)
    blk = tl.program_id(1)
    slot = tl.load(rows_ptr + r).to(tl.int64)
    pos = tl.load(rows_ptr + n_rows + r).to(tl.int64)
    neg = tl.load(rows_ptr + 2 * n_rows + r).to(tl.int64)
    numel = tl.load(rows_ptr + 3 * n_rows + r)
    g = tl.load(params_ptr + r)
    dt = tl.load(params_ptr + n_rows + r)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    x_ptrs = state_ptr + slot * state_row_stride + offs
    x = tl.load(x_ptrs, mask=mask)
    vp = tl.load(vel_ptr + pos * vel_row_stride + offs, mask=mask).to(tl.float32)
    vn = tl.load(vel_ptr + neg * vel_row_stride + offs, mask=mask).to(tl.float32)
    v = vn + g * (vp - vn)
    tl.store(x_ptrs, (x.to(tl.float32) + v * dt).to(x.dtype), mask=mask)


def guided_euler_triton_(
    state: torch.Tensor,
    velocity: torch.Tensor,
    rows: torch.Tensor,
    params: torch.Tensor,
    max_numel: int,
    block: int,
) -> torch.Tensor:
    """Launch over ``rows`` ``(4, R)`` int64 (slot, pos, neg, numel) and ``params`` ``(2, R)``
    float32 (guidance, dt), both on ``state``'s device."""
    n_rows = rows.shape[1]
    grid = (n_rows, triton.cdiv(max_numel, block))
    _guided_euler_kernel[grid](
        state,
        velocity,
        rows,
        params,
        n_rows,
        state.stride(0),
        velocity.stride(0),
        BLOCK=block,
        num_warps=4,
    )
    return state
