"""Triton flash-attention forward for grouped key/value heads with a key-padding mask and a
symmetric sliding window: one program per (block of queries, batch row and head) streams the key
blocks its window can reach (all of them without a window) with an online softmax, so a banded
layer reads about ``(BLOCK_M + 2·window) / M`` of the keys and no dense mask exists anywhere."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from triton_dispatch.declaration import Call
from triton_dispatch.device import device_facts
from triton_dispatch.launch import KernelLaunch


@triton.jit
def _attend_keys(
    acc, m_i, l_i, q, pos, k_base, v_base, mask_row, kw_ptr, offs_d, start, sk_n, sv_n, sm_n,
    n_k, window, scale_log2e, eps,
    HAS_MASK: tl.constexpr, K_NORM: tl.constexpr, EDGE: tl.constexpr, WINDOWED: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One key block into the online softmax. ``EDGE``: the block may cross the window's edge
    or the end of the keys (bounds and band are checked); inner blocks skip both."""
    offs_n = start + tl.arange(0, BLOCK_N)
    if EDGE:
        in_k = offs_n < n_k
        kt = tl.load(k_base + offs_n[None, :] * sk_n + offs_d[:, None], mask=in_k[None, :],
                     other=0.0)  # fmt: skip
    else:
        kt = tl.load(k_base + offs_n[None, :] * sk_n + offs_d[:, None])
    if K_NORM:  # each key's RMS norm as it is loaded (few keys: cross-attention)
        kf = kt.to(tl.float32)
        k_inv = 1.0 / tl.sqrt(tl.sum(kf * kf, axis=0) / HEAD_DIM + eps)
        kw = tl.load(kw_ptr + offs_d).to(tl.float32)
        kt = (kf * k_inv[None, :] * kw[:, None]).to(q.dtype)
    s = tl.dot(q, kt, input_precision=PRECISION) * scale_log2e
    if EDGE:
        valid = in_k[None, :]
        if WINDOWED:
            diff = pos[:, None] - offs_n[None, :]
            valid = valid & (diff <= window) & (diff >= -window)
        if HAS_MASK:
            keep = tl.load(mask_row + offs_n * sm_n, mask=in_k, other=0)
            valid = valid & (keep != 0)[None, :]
        s = tl.where(valid, s, float("-inf"))
    elif HAS_MASK:
        keep = tl.load(mask_row + offs_n * sm_n)
        s = tl.where((keep != 0)[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # a query with no key seen yet keeps exponents finite (its probabilities are all 0)
    m_base = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_base)
    p = tl.math.exp2(s - m_base[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if EDGE:
        v = tl.load(v_base + offs_n[:, None] * sv_n + offs_d[None, :], mask=in_k[:, None],
                    other=0.0)  # fmt: skip
    else:
        v = tl.load(v_base + offs_n[:, None] * sv_n + offs_d[None, :])
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, mask_ptr, qw_ptr, kw_ptr,
    sq_b, sq_n, sq_h, sk_b, sk_n, sk_h, sv_b, sv_n, sv_h, so_b, so_n, so_h, sm_b, sm_n,
    n_q, n_k, heads, group, scale_log2e, window, eps,
    HAS_MASK: tl.constexpr, Q_NORM: tl.constexpr, K_NORM: tl.constexpr, WINDOWED: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAIRED: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """``PAIRED`` query heads that share a key/value head run in one program: its tile holds
    ``BLOCK_M`` positions of each, so every key block loaded serves them all."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // (heads // PAIRED)).to(tl.int64)
    h0 = bh % (heads // PAIRED) * PAIRED
    hk = h0 // group
    rows = tl.arange(0, PAIRED * BLOCK_M)
    head = h0 + rows // BLOCK_M
    pos = pid_m * BLOCK_M + rows % BLOCK_M
    offs_d = tl.arange(0, HEAD_DIM)
    q_rows = q_ptr + b * sq_b + head[:, None] * sq_h + pos[:, None] * sq_n + offs_d[None, :]
    q = tl.load(q_rows, mask=(pos < n_q)[:, None], other=0.0)
    if Q_NORM:  # the query's RMS norm, folded into its one load
        qf = q.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(qf * qf, axis=1) / HEAD_DIM + eps)
        w = tl.load(qw_ptr + offs_d).to(tl.float32)
        q = (qf * inv[:, None] * w[None, :]).to(q.dtype)
    k_base = k_ptr + b * sk_b + hk * sk_h
    v_base = v_ptr + b * sv_b + hk * sv_h
    mask_row = mask_ptr + b * sm_b
    m_i = tl.full((PAIRED * BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((PAIRED * BLOCK_M,), tl.float32)
    acc = tl.zeros((PAIRED * BLOCK_M, HEAD_DIM), tl.float32)
    first = pid_m * BLOCK_M
    lo = 0
    hi = n_k
    # inner blocks: inside every position's band and before the end of the keys
    inner_lo = 0
    inner_hi = n_k // BLOCK_N * BLOCK_N
    if WINDOWED:
        lo = tl.maximum(first - window, 0) // BLOCK_N * BLOCK_N
        hi = tl.minimum(first + BLOCK_M + window, n_k)
        inner_lo = tl.cdiv(tl.maximum(first + BLOCK_M - 1 - window, 0), BLOCK_N) * BLOCK_N
        last_start = first + window - BLOCK_N + 1  # an inner block starts at or before it
        inner_hi = tl.where(last_start >= 0,
                            tl.minimum((tl.maximum(last_start, 0) // BLOCK_N + 1) * BLOCK_N,
                                       inner_hi), 0)  # fmt: skip
    inner_lo = tl.minimum(tl.maximum(inner_lo, lo), hi)
    inner_hi = tl.minimum(tl.maximum(inner_hi, inner_lo), hi)
    for part in tl.static_range(3):  # leading edge, inner blocks, trailing edge
        if part == 0:
            begin, end = lo, inner_lo
        elif part == 1:
            begin, end = inner_lo, inner_hi
        else:
            begin, end = inner_hi, hi
        for start in range(begin, end, BLOCK_N):
            acc, m_i, l_i = _attend_keys(
                acc, m_i, l_i, q, pos, k_base, v_base, mask_row, kw_ptr, offs_d, start, sk_n,
                sv_n, sm_n, n_k, window, scale_log2e, eps, HAS_MASK, K_NORM, part != 1, WINDOWED,
                HEAD_DIM, BLOCK_N, PRECISION,
            )  # fmt: skip
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # no key: zeros
    o_rows = o_ptr + b * so_b + head[:, None] * so_h + pos[:, None] * so_n + offs_d[None, :]
    tl.store(o_rows, out.to(q.dtype), mask=(pos < n_q)[:, None])


@triton.jit
def _few_keys_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, mask_ptr, qw_ptr, kw_ptr,
    sq_b, sq_n, sq_h, sk_b, sk_n, sk_h, sv_b, sv_n, sv_h, so_b, so_n, so_h, sm_b, sm_n,
    n_q, n_k, heads, group, scale_log2e, eps,
    HAS_MASK: tl.constexpr, Q_NORM: tl.constexpr, K_NORM: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr, PRECISION: tl.constexpr,
    WEIGHTS: tl.constexpr = False,
):  # fmt: skip
    """Attention to at most ``BLOCK_N`` keys (cross-attention to conditioning tokens): the keys
    and values of a (batch row, head) fit one tile, so a program loads and norms them once and
    walks every ``CHUNKS``-th block of queries with an exact softmax, the next block's queries
    already loading while this one computes. The work is reading queries and writing outputs.
    ``WEIGHTS``: the softmax probabilities are the output (``o_ptr`` rows of ``n_k`` keys, unit
    stride), and the values are never read."""
    chunk = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // heads).to(tl.int64)
    h = bh % heads
    hk = h // group
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    in_k = offs_n < n_k
    kt = tl.load(k_ptr + b * sk_b + hk * sk_h + offs_n[None, :] * sk_n + offs_d[:, None],
                 mask=in_k[None, :], other=0.0)  # fmt: skip
    if K_NORM:
        kf = kt.to(tl.float32)
        k_inv = 1.0 / tl.sqrt(tl.sum(kf * kf, axis=0) / HEAD_DIM + eps)
        kw = tl.load(kw_ptr + offs_d).to(tl.float32)
        kt = (kf * k_inv[None, :] * kw[:, None]).to(kt.dtype)
    if not WEIGHTS:
        v = tl.load(v_ptr + b * sv_b + hk * sv_h + offs_n[:, None] * sv_n + offs_d[None, :],
                    mask=in_k[:, None], other=0.0)  # fmt: skip
    valid = in_k
    if HAS_MASK:
        keep = tl.load(mask_ptr + b * sm_b + offs_n * sm_n, mask=in_k, other=0)
        valid = valid & (keep != 0)
    key_bias = tl.where(valid, 0.0, float("-inf"))
    if Q_NORM:
        qw = tl.load(qw_ptr + offs_d).to(tl.float32)
    q_base = q_ptr + b * sq_b + h * sq_h + offs_d[None, :]
    o_base = o_ptr + b * so_b + h * so_h + offs_d[None, :]
    blocks = tl.cdiv(n_q, BLOCK_M)
    offs_m = chunk * BLOCK_M + tl.arange(0, BLOCK_M)
    q_next = tl.load(q_base + offs_m[:, None] * sq_n, mask=(offs_m < n_q)[:, None], other=0.0)
    for blk in range(chunk, blocks, CHUNKS):
        q = q_next
        rows = offs_m
        offs_m = (blk + CHUNKS) * BLOCK_M + tl.arange(0, BLOCK_M)
        # issued before this block's arithmetic: its memory latency hides behind it
        q_next = tl.load(q_base + offs_m[:, None] * sq_n, mask=(offs_m < n_q)[:, None],
                         other=0.0)  # fmt: skip
        if Q_NORM:
            qf = q.to(tl.float32)
            inv = 1.0 / tl.sqrt(tl.sum(qf * qf, axis=1) / HEAD_DIM + eps)
            q = (qf * inv[:, None] * qw[None, :]).to(kt.dtype)
        s = tl.dot(q, kt, input_precision=PRECISION) * scale_log2e + key_bias[None, :]
        m = tl.max(s, axis=1)
        m = tl.where(m == float("-inf"), 0.0, m)  # no key: probabilities 0, output 0
        p = tl.math.exp2(s - m[:, None])
        total = tl.sum(p, axis=1)
        if WEIGHTS:
            w = p / tl.where(total == 0.0, 1.0, total)[:, None]
            tl.store(o_ptr + b * so_b + h * so_h + rows[:, None] * so_n + offs_n[None, :],
                     w.to(kt.dtype), mask=(rows < n_q)[:, None] & in_k[None, :])  # fmt: skip
        else:
            out = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            out = out / tl.where(total == 0.0, 1.0, total)[:, None]
            tl.store(o_base + rows[:, None] * so_n, out.to(kt.dtype), mask=(rows < n_q)[:, None])


#: Up to this many keys (and no window) a (batch row, head)'s keys and values fit one tile.
FEW_KEYS = 128


def _uses_cudnn(call: Call) -> bool:
    """Whether PyTorch's fused attention (cuDNN on Hopper) runs the call: a full window over
    every key, half precision, on a CUDA device. It beats this kernel there (H200, ACE-Step's
    published shapes: 0.077 against 0.110 ms); with a window or a key mask it needs a dense mask
    and loses (0.136 against 0.063 ms windowed)."""
    q = call["q"]
    return (
        call.backend == "triton"
        and call["key_mask"] is None
        and call["q_weight"] is None
        and call["k_weight"] is None
        and call["window"] < 0
        and q.dtype in (torch.float16, torch.bfloat16)
        and q.shape[3] <= 128
    )


def _cudnn_forward(call: Call):
    scale, gqa = call["scale"], call["q"].shape[2] != call["k"].shape[2]

    def forward(q, k, v, key_mask, q_weight, k_weight):
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale, enable_gqa=gqa
        )
        return out.transpose(1, 2).contiguous()  # (B, N, H, d): a no-op for its layout

    return forward


def attention_plan(call: Call) -> SimpleNamespace:
    """The launch of a validated call, bound once per kind of call (strides, window, blocks), or
    PyTorch's fused attention where it is faster (:func:`_uses_cudnn`)."""
    if _uses_cudnn(call):
        return SimpleNamespace(forward=_cudnn_forward(call))
    q, k, mask = call["q"], call["k"], call["key_mask"]
    b, n, heads, d = q.shape
    n_k, kv_heads = k.shape[1], k.shape[2]
    # a window as wide as the sequences is no window
    if n_k <= FEW_KEYS and (call["window"] < 0 or call["window"] >= max(n, n_k) - 1):
        return _few_keys_plan(call)
    # two query heads of a key/value head per program: each key block loaded serves both (up
    # to heads of 128: a pair's float32 accumulator of 256-wide heads would spill)
    paired = 2 if (heads // kv_heads) % 2 == 0 and d <= 128 else 1
    if call.backend == "interpret":
        block_m, block_n, warps, stages = 16, 16, 4, 1
    else:
        # H200, ACE-Step's published shapes (B 8, N 750, 16/8 heads of 128, window 128): paired
        # heads in 64x32 blocks, 4 warps, 3 stages: 0.0655 ms (key mask 0.0758) against 0.0745
        # (0.0872) one head per program in 64x64 blocks, 0.071-0.096 for 64x64 and 64x128
        # paired, 8 warps; full with a key mask 0.142 against 0.153 ms
        block_m, block_n = 64, 32
        warps, stages = 4, 3
    # float32 inputs get float32 products (tf32 would lose the precision they were chosen for)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    launch = KernelLaunch(
        _attention_kernel,
        (triton.cdiv(n, block_m), b * heads // paired),
        dict(
            **_strides(call, n, heads, d),
            n_q=n, n_k=n_k, heads=heads, group=heads // kv_heads,
            scale_log2e=call["scale"] * math.log2(math.e), window=max(call["window"], 0),
            eps=call["eps"], HAS_MASK=mask is not None, Q_NORM=call["q_weight"] is not None,
            K_NORM=call["k_weight"] is not None, WINDOWED=call["window"] >= 0, HEAD_DIM=d,
            BLOCK_M=block_m, BLOCK_N=block_n, PAIRED=paired, PRECISION=precision,
        ),
        device=call.device,
        options={"num_warps": warps, "num_stages": stages},
    )  # fmt: skip

    return SimpleNamespace(forward=_forward_through(launch))


def _strides(call: Call, n: int, heads: int, d: int) -> dict:
    q, k, mask = call["q"], call["k"], call["key_mask"]
    v = call["v"] if "v" in call.tensors else k  # a call for the weights alone has no values
    # the output is laid out (B, N, H, d): flattening its heads gives the out-projection's input
    return dict(
        sq_b=q.stride(0), sq_n=q.stride(1), sq_h=q.stride(2),
        sk_b=k.stride(0), sk_n=k.stride(1), sk_h=k.stride(2),
        sv_b=v.stride(0), sv_n=v.stride(1), sv_h=v.stride(2),
        so_b=n * heads * d, so_n=heads * d, so_h=d,
        sm_b=0 if mask is None else mask.stride(0), sm_n=0 if mask is None else mask.stride(1),
    )  # fmt: skip


def few_keys_config(backend: str, batch_heads: int, n_q: int, sm_count: int) -> dict:
    """Query block, chunks and warps of :func:`_few_keys_attention_kernel`: as many chunks per
    (batch row, head) as let every program be resident at once (three per SM at head size 128).
    H200, ACE-Step's published cross-attention (750 queries, 16/8 heads, 64 keys): 8 rows 0.024
    ms with 3 chunks (0.031-0.036 with 4-12, 0.046 for the flash kernel); 16 rows 0.043 ms with
    1 chunk (0.085 flash)."""
    if backend == "interpret":
        return dict(BLOCK_M=16, CHUNKS=2, num_warps=4)
    block_m = 64
    blocks = triton.cdiv(n_q, block_m)
    chunks = max(1, min(blocks, 3 * sm_count // batch_heads))
    return dict(BLOCK_M=block_m, CHUNKS=chunks, num_warps=4)


def few_keys_launch(call: Call, *, weights: bool = False) -> KernelLaunch:
    """The bound launch of :func:`_few_keys_attention_kernel` for a validated call of at most
    :data:`FEW_KEYS` keys and no window; ``weights``: the launch writes the ``(B, N, H, M)``
    softmax probabilities instead of the outputs (the call then has no values: ``k`` stands in)."""
    q, k = call["q"], call["k"]
    b, n, heads, d = q.shape
    n_k, kv_heads = k.shape[1], k.shape[2]
    sm_count = device_facts(q.device).sm_count
    config = few_keys_config(call.backend, b * heads, n, sm_count)
    warps = config.pop("num_warps")
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    strides = _strides(call, n, heads, d)
    if weights:  # (B, N, H, M) contiguous
        strides.update(so_b=n * heads * n_k, so_n=heads * n_k, so_h=n_k)
    return KernelLaunch(
        _few_keys_attention_kernel,
        (config["CHUNKS"], b * heads),
        dict(
            **strides,
            n_q=n, n_k=n_k, heads=heads, group=heads // kv_heads,
            scale_log2e=call["scale"] * math.log2(math.e), eps=call["eps"],
            HAS_MASK=call["key_mask"] is not None, Q_NORM=call["q_weight"] is not None,
            K_NORM=call["k_weight"] is not None, HEAD_DIM=d,
            BLOCK_N=max(16, triton.next_power_of_2(n_k)), PRECISION=precision, WEIGHTS=weights,
            **config,
        ),
        device=call.device,
        options={"num_warps": warps, "num_stages": 1},
    )  # fmt: skip


def _few_keys_plan(call: Call) -> SimpleNamespace:
    return SimpleNamespace(forward=_forward_through(few_keys_launch(call)))


def _forward_through(launch: KernelLaunch):
    def forward(q, k, v, key_mask, q_weight, k_weight):
        out = q.new_empty(q.shape)
        # absent operands are never read (their constexpr flags are off): q stands in
        launch(q, k, v, out, q if key_mask is None else key_mask,
               q if q_weight is None else q_weight, q if k_weight is None else k_weight)  # fmt: skip
        return out

    return forward
