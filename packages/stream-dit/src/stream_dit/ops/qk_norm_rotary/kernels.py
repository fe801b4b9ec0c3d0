"""Triton kernel of the per-head query/key RMS norm with the rotary embedding, in place: one
program per token holds all its query and key heads as two half-head tiles, so the rotation pairs
element ``i`` with ``i + head_dim/2`` in registers."""

from __future__ import annotations

from types import SimpleNamespace

import triton
import triton.language as tl

from triton_dispatch import next_power_of_2
from triton_dispatch.declaration import Call
from triton_dispatch.launch import KernelLaunch


@triton.jit
def _qk_norm_rotary_kernel(
    x_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr,
    tokens, row_stride, q_heads, heads, eps,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, ROTARY: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    h = tl.arange(0, BLOCK_H)
    c = tl.arange(0, HALF)
    head_ok = (h < heads)[:, None]
    first = x_ptr + row.to(tl.int64) * row_stride + h[:, None] * (2 * HALF) + c[None, :]
    a_raw = tl.load(first, mask=head_ok, other=0.0)
    b_raw = tl.load(first + HALF, mask=head_ok, other=0.0)
    # the weights and the position's tables are loaded before the reduction, all in flight
    is_q = (h < q_heads)[:, None]
    wqa = tl.load(wq_ptr + c, eviction_policy="evict_last")[None, :]
    wka = tl.load(wk_ptr + c, eviction_policy="evict_last")[None, :]
    wqb = tl.load(wq_ptr + HALF + c, eviction_policy="evict_last")[None, :]
    wkb = tl.load(wk_ptr + HALF + c, eviction_policy="evict_last")[None, :]
    if ROTARY:
        at = (row % tokens) * (2 * HALF) + c
        ca = tl.load(cos_ptr + at)[None, :]
        cb = tl.load(cos_ptr + HALF + at)[None, :]
        sa = tl.load(sin_ptr + at)[None, :]
        sb = tl.load(sin_ptr + HALF + at)[None, :]
    a = a_raw.to(tl.float32)
    b = b_raw.to(tl.float32)
    inv = 1.0 / tl.sqrt((tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)) / (2 * HALF) + eps)
    a = a * inv[:, None] * tl.where(is_q, wqa, wka).to(tl.float32)
    b = b * inv[:, None] * tl.where(is_q, wqb, wkb).to(tl.float32)
    if ROTARY:
        a, b = a * ca - b * sa, b * cb + a * sb
    tl.store(first, a.to(a_raw.dtype), mask=head_ok)
    tl.store(first + HALF, b.to(a_raw.dtype), mask=head_ok)


def qk_norm_rotary_plan(call: Call) -> SimpleNamespace:
    """The launch of a validated call, bound once per kind of call: one program per token."""
    x, cos = call["x"], call["cos"]
    b, n, width = x.shape
    heads = call["q_heads"] + call["k_heads"]
    half = call["weight_q"].numel() // 2
    block_h = next_power_of_2(heads)
    launch = KernelLaunch(
        _qk_norm_rotary_kernel,
        (b * n,),
        dict(
            tokens=n, row_stride=width, q_heads=call["q_heads"], heads=heads, eps=call["eps"],
            HALF=half, BLOCK_H=block_h, ROTARY=cos is not None,
        ),
        device=call.device,
        options={"num_warps": 4 if block_h * half >= 1024 else 2},
    )  # fmt: skip

    def forward(x, weight_q, weight_k, cos, sin) -> tuple:
        # without rotation the tables are never read: the weights stand in
        launch(x, weight_q, weight_k, weight_q if cos is None else cos,
               weight_q if sin is None else sin)  # fmt: skip
        return ()

    return SimpleNamespace(forward=forward)
