"""Triton kernels of the SwiGLU gate: one program per (token block, column block), reading the
gate and up halves of the fused projection once and writing the product; and one that owns
whole rows, writing them as float8 e4m3 with a scale per row (the next GEMM's FP8 operand)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import triton
import triton.language as tl

from triton_dispatch import next_power_of_2
from triton_dispatch.declaration import Call
from triton_dispatch.launch import KernelLaunch

from ..fp8_linear.kernels import quantize_row_block


@triton.jit
def _swiglu_kernel(
    x_ptr, out_ptr, n_rows, inner,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < inner)[None, :]
    rows = rows.to(tl.int64)[:, None]
    src = x_ptr + rows * (2 * inner) + cols[None, :]
    g_raw = tl.load(src, mask=mask, other=0.0)
    g = g_raw.to(tl.float32)
    u = tl.load(src + inner, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + rows * inner + cols[None, :], y.to(g_raw.dtype), mask=mask)


@triton.jit
def _swiglu_fp8_kernel(
    x_ptr, out_ptr, out_scale_ptr, n_rows, inner,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < inner)[None, :]
    wide = rows.to(tl.int64)[:, None]
    src = x_ptr + wide * (2 * inner) + cols[None, :]
    g = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(src + inner, mask=mask, other=0.0).to(tl.float32)
    q, row_scale = quantize_row_block(g / (1.0 + tl.exp(-g)) * u, row_ok)
    tl.store(out_ptr + wide * inner + cols[None, :], q, mask=mask)
    tl.store(out_scale_ptr + rows, row_scale, mask=row_ok)


def swiglu_fp8_plan(call: Call) -> SimpleNamespace:
    """The launch of a validated call: whole rows per program (the row's amax is its scale)."""
    x = call["gate_up"]
    inner = x.shape[-1] // 2
    n_rows = x.numel() // x.shape[-1]
    block_n = next_power_of_2(inner)
    block_m = 16 if call.backend == "interpret" else max(1, 4096 // block_n)
    launch = KernelLaunch(
        _swiglu_fp8_kernel,
        (triton.cdiv(n_rows, block_m),),
        dict(n_rows=n_rows, inner=inner, BLOCK_M=block_m, BLOCK_N=block_n),
        device=call.device,
        options={"num_warps": 8 if block_m * block_n >= 4096 else 4},
    )

    def forward(gate_up):
        shape = (*gate_up.shape[:-1], inner)
        out = torch.empty(shape, device=gate_up.device, dtype=torch.float8_e4m3fn)
        scales = torch.empty(shape[:-1], device=gate_up.device, dtype=torch.float32)
        launch(gate_up, out, scales)
        return out, scales

    return SimpleNamespace(forward=forward)


def swiglu_plan(call: Call) -> SimpleNamespace:
    """The launch of a validated call, bound once per kind of call."""
    x = call["gate_up"]
    inner = x.shape[-1] // 2
    n_rows = x.numel() // x.shape[-1]
    block_m, block_n = (16, 32) if call.backend == "interpret" else (4, 512)
    launch = KernelLaunch(
        _swiglu_kernel,
        (triton.cdiv(n_rows, block_m), triton.cdiv(inner, block_n)),
        dict(n_rows=n_rows, inner=inner, BLOCK_M=block_m, BLOCK_N=block_n),
        device=call.device,
        options={"num_warps": 4},
    )

    def forward(gate_up):
        out = gate_up.new_empty((*gate_up.shape[:-1], inner))
        launch(gate_up, out)
        return out

    return SimpleNamespace(forward=forward)
