"""Triton kernel of the per-head values through the output projection: one program per (batch
row and head, block of output columns) multiplies the head's few value rows, loaded once, by its
slice of the projection."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import triton
import triton.language as tl

from triton_dispatch.declaration import Call
from triton_dispatch.launch import KernelLaunch


@triton.jit
def _head_values_kernel(
    v_ptr, w_ptr, o_ptr, sv_b, sv_m, sv_h, n_keys, d_out, heads, group,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    bh = tl.program_id(0)
    b = (bh // heads).to(tl.int64)
    h = bh % heads
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    values = tl.load(v_ptr + b * sv_b + (h // group) * sv_h + rows[:, None] * sv_m
                     + offs_d[None, :], mask=(rows < n_keys)[:, None], other=0.0)  # fmt: skip
    # (HEAD_DIM, BLOCK_N): column n of the tile is row n of the weight's head slice
    w = tl.load(w_ptr + cols[None, :].to(tl.int64) * (heads * HEAD_DIM) + h * HEAD_DIM
                + offs_d[:, None], mask=(cols < d_out)[None, :], other=0.0)  # fmt: skip
    acc = tl.dot(values, w, input_precision=PRECISION)
    out_rows = (b * heads + h) * n_keys + rows
    tl.store(o_ptr + out_rows[:, None] * d_out + cols[None, :], acc.to(values.dtype),
             mask=(rows < n_keys)[:, None] & (cols < d_out)[None, :])  # fmt: skip


def head_values_plan(call: Call) -> SimpleNamespace:
    """The launch of a validated call, bound once per kind of call."""
    v, weight, heads = call["v"], call["weight"], call["heads"]
    b, m, kv_heads, d = v.shape
    d_out = weight.shape[0]
    block_n = 16 if call.backend == "interpret" else 128
    launch = KernelLaunch(
        _head_values_kernel,
        (b * heads, triton.cdiv(d_out, block_n)),
        dict(
            sv_b=v.stride(0), sv_m=v.stride(1), sv_h=v.stride(2), n_keys=m, d_out=d_out,
            heads=heads, group=heads // kv_heads, HEAD_DIM=d,
            BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=block_n,
            PRECISION="ieee" if v.dtype == torch.float32 else "tf32",
        ),
        device=call.device,
        options={"num_warps": 4, "num_stages": 1},
    )  # fmt: skip

    def forward(v, weight):
        out = v.new_empty((b, heads * m, d_out))
        launch(v, weight, out)
        return out

    return SimpleNamespace(forward=forward)
