"""Triton kernel of the gated residual add + RMS norm + AdaLN modulation: each program owns whole
rows, so the mean square is a register reduction and every element is read once and written
once (the residual and the normed row). The normed row can leave as float8 e4m3 with its own
scale (whole rows give its amax for free), ready for an FP8 GEMM."""

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
def _adaln_rms_norm_kernel(
    x_ptr, delta_ptr, gate_ptr, w_ptr, scale_ptr, shift_ptr, res_ptr, out_ptr, out_scale_ptr,
    n_rows, tokens, width, gate_stride, scale_stride, shift_stride, eps,
    HAS_DELTA: tl.constexpr, HAS_GATE: tl.constexpr, HAS_MOD: tl.constexpr,
    OUT_FP8: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < n_rows
    col_ok = cols < width
    mask = row_ok[:, None] & col_ok[None, :]
    offs = rows.to(tl.int64)[:, None] * width + cols[None, :]
    batch = (rows // tokens).to(tl.int64)[:, None]
    # every load is issued before the row's reduction, so they are all in flight at once; the
    # per-batch vectors stay in L2 for the other rows of their batch, the branch is read once
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0, eviction_policy="evict_last")
    if HAS_DELTA:
        step = tl.load(delta_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first")
    if HAS_GATE:
        g = tl.load(gate_ptr + batch * gate_stride + cols[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_last")  # fmt: skip
    if HAS_MOD:
        sc = tl.load(scale_ptr + batch * scale_stride + cols[None, :], mask=mask, other=0.0,
                     eviction_policy="evict_last")  # fmt: skip
        sh = tl.load(shift_ptr + batch * shift_stride + cols[None, :], mask=mask, other=0.0,
                     eviction_policy="evict_last")  # fmt: skip
    r = x.to(tl.float32)
    if HAS_DELTA:
        step = step.to(tl.float32)
        if HAS_GATE:
            step = step * g.to(tl.float32)
        # the residual stream is kept in the input's dtype: the norm reads the rounded sum
        rounded = (r + step).to(x.dtype)
        tl.store(res_ptr + offs, rounded, mask=mask)
        r = rounded.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(r * r, axis=1) / width + eps)
    y = r * inv[:, None] * w.to(tl.float32)[None, :]
    if HAS_MOD:
        y = y * (1.0 + sc.to(tl.float32)) + sh.to(tl.float32)
    if OUT_FP8:
        q, row_scale = quantize_row_block(y, row_ok)
        tl.store(out_ptr + offs, q, mask=mask)
        tl.store(out_scale_ptr + rows, row_scale, mask=row_ok)
    else:
        tl.store(out_ptr + offs, y.to(x.dtype), mask=mask)


def _row_stride(t) -> int:
    return 0 if t is None else t.stride(0)


def adaln_rms_norm_plan(call: Call, *, fp8: bool = False) -> SimpleNamespace:
    """The launch of a validated call, bound once per kind of call: whole rows per program, as
    many rows as fill about 4096 elements (one on the interpreter's few-program budget is 16).
    ``fp8``: the normed rows leave as ``torch.float8_e4m3fn`` with a float32 scale per row."""
    x, scale = call["x"], call["scale"]
    delta, gate = call.tensors.get("delta"), call.tensors.get("gate")
    b, n, width = x.shape
    n_rows = b * n
    block_d = next_power_of_2(width)
    if call.backend == "interpret":
        block_m = 16
    else:
        block_m = max(1, min(16, 4096 // block_d))
    warps = 8 if block_m * block_d >= 4096 else 4
    launch = KernelLaunch(
        _adaln_rms_norm_kernel,
        (triton.cdiv(n_rows, block_m),),
        dict(
            n_rows=n_rows, tokens=n, width=width,
            gate_stride=_row_stride(gate), scale_stride=_row_stride(scale),
            shift_stride=_row_stride(call["shift"]), eps=call["eps"],
            HAS_DELTA=delta is not None, HAS_GATE=gate is not None, HAS_MOD=scale is not None,
            OUT_FP8=fp8, BLOCK_M=block_m, BLOCK_D=block_d,
        ),
        device=call.device,
        options={"num_warps": warps},
    )  # fmt: skip

    def normed_like(x):
        if not fp8:
            return x.new_empty(x.shape), x  # x stands in for the unused scales
        normed = torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn)
        return normed, torch.empty(x.shape[:2], device=x.device, dtype=torch.float32)

    def forward(x, weight, delta, gate, scale, shift):
        residual = x.new_empty(x.shape)
        normed, scales = normed_like(x)
        # absent operands are never read (their constexpr flags are off): x stands in
        launch(
            x, delta, x if gate is None else gate, weight,
            x if scale is None else scale, x if shift is None else shift, residual, normed,
            scales,
        )  # fmt: skip
        return (residual, normed, scales) if fp8 else (residual, normed)

    def norm_only(x, weight, scale, shift):
        normed, scales = normed_like(x)
        launch(
            x, x, x, weight, x if scale is None else scale, x if shift is None else shift,
            normed, normed, scales,
        )  # fmt: skip
        return (normed, scales) if fp8 else normed

    return SimpleNamespace(forward=forward if delta is not None else norm_only)
