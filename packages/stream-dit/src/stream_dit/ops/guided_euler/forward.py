"""Triton kernel: classifier-free guidance combine and Euler step in one pass over memory.

One program handles one block of one row's ``T·C`` elements; row indices and per-row scalars come
from small device tensors, so a tick's guided rows are one launch whatever their lengths.
"""

from __future__ import annotations

from types import SimpleNamespace

import triton
import triton.language as tl

from triton_dispatch.declaration import Call
from triton_dispatch.launch import KernelLaunch


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


def guided_euler_plan(call: Call) -> SimpleNamespace:
    """The launch of a validated call, bound once per kind of call: one program per row and block
    of the longest row the tensors can hold (``min(T_s, T_v)·C`` elements; a block past its own
    row's ``numel`` stores nothing), so the grid depends on metadata only and a repeat call
    launches directly, without reading the row lengths."""
    state, velocity, rows = call["state"], call["velocity"], call["rows"]
    n_rows, width = rows.shape[1], min(state.shape[1], velocity.shape[1]) * state.shape[2]
    if n_rows == 0 or width == 0:  # no row, or rows of no element: nothing to update
        return SimpleNamespace(forward=lambda *tensors: ())
    block = 256 if call.backend == "interpret" else 1024
    launch = KernelLaunch(
        _guided_euler_kernel,
        (n_rows, triton.cdiv(width, block)),
        dict(
            n_rows=n_rows,
            state_row_stride=state.stride(0),
            vel_row_stride=velocity.stride(0),
            BLOCK=block,
        ),
        device=call.device,
        options={"num_warps": 4},
    )

    def forward(state, velocity, rows, params) -> tuple:
        launch(state, velocity, rows, params)
        return ()  # the op's one effect is the update of ``state``

    return SimpleNamespace(forward=forward)
