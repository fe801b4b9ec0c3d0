"""Triton kernel: one convolution layer of a Snake-activated decoder as an implicit GEMM over
channels-last activations, with the layer's neighbours folded into its epilogue.

A program computes a ``BLOCK_M × BLOCK_N`` tile of ``y[q, j] = Σ_tap Σ_c x[q + tap·DIL − PAD, c] ·
w[tap, c, j]`` for one batch row. The taps and input channels run as one flat loop so that Triton
pipelines it even when a tap holds only one or two channel blocks. The epilogue adds the bias,
optionally applies Snake and a 1×1 convolution (the second half of a residual unit, when the whole
channel width fits one tile), adds the residual, and stores the result and/or the Snake of it that
the next layer reads: each activation is computed once, where it is produced, instead of in a
separate pass or once per tap of its consumer. Output rows map to time steps through ``PHASES``
and ``SHIFT``, which turns a transposed convolution of stride ``PHASES`` into the same GEMM.

A decoder's last convolution (to a few audio channels) reads only the Snake of the last unit's
output; as a ``HEAD`` the epilogue multiplies that Snake by the head's taps side by side and stores
the per-tap partial sums (a few floats a row instead of the whole row of channels), and
``tap_sum_kernel`` adds each output step's taps from its neighbours' rows. Weights, biases and
Snake constants are read as the layer holds them (bias and constants in any float dtype, cast to
float32 on load).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _snake(y, alpha, inv_beta, FAST_SIN: tl.constexpr):
    ax = y * alpha
    if FAST_SIN:
        # the products feed bf16/fp16 GEMMs: the hardware approximation is far inside their
        # rounding, and the accurate libdevice sine would cost more than the tile's MMAs
        s = tl.inline_asm_elementwise(
            "sin.approx.f32 $0, $1;", "=r,r", [ax], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        s = tl.sin(ax)
    return y + inv_beta * s * s


@triton.jit
def _conv_tile(
    pid_m,
    pid_n,
    b32,
    x,  # (B, L_in, CIN) contiguous
    weight,  # (TAPS, CIN, N) contiguous
    bias,  # (N,)
    pw_weight,  # (N, N) contiguous: the 1x1 convolution, in -> out
    pw_bias,  # (N,)
    pw_alpha,  # (N,): Snake before the 1x1 convolution
    pw_inv_beta,
    out_alpha,  # (COUT,): Snake of the stored copy
    out_inv_beta,
    head_weight,  # (HEAD_TAPS, COUT, HEAD_C) contiguous
    residual,  # (B, L_out, COUT)
    out,  # (B, L_out, COUT)
    snake_out,  # (B, L_out, COUT)
    partial,  # (B, L_out, HEAD_P) float32: column tap·HEAD_C + c
    x_desc,  # with TMA: x as (B, L_in, CIN) in [1, BLOCK_M, BLOCK_K] boxes
    w_desc,  # with TMA: weight as (TAPS·CIN, N) in [BLOCK_K, BLOCK_N] boxes
    L_in,
    L_out,
    rows,
    CIN: tl.constexpr,
    CIN_P: tl.constexpr,
    N: tl.constexpr,
    N_P: tl.constexpr,
    COUT: tl.constexpr,
    TAPS: tl.constexpr,
    DIL,  # runtime values, not specialised on: one compiled kernel serves every dilation
    PAD,
    PHASES: tl.constexpr,
    SHIFT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    POINTWISE: tl.constexpr,
    PW_BIAS: tl.constexpr,
    RESIDUAL: tl.constexpr,
    STORE_OUT: tl.constexpr,
    STORE_SNAKE: tl.constexpr,
    HEAD: tl.constexpr,
    HEAD_TAPS: tl.constexpr,
    HEAD_C: tl.constexpr,
    HEAD_P: tl.constexpr,
    FAST_SIN: tl.constexpr,
    IEEE: tl.constexpr,
    TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    A_CACHE: tl.constexpr,
    W_CACHE: tl.constexpr,
):
    """One ``BLOCK_M × BLOCK_N`` output tile of batch row ``b32`` (the body of both launches)."""
    b = b32.to(tl.int64)
    q = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    x_base = x + b * L_in * CIN
    precision: tl.constexpr = "ieee" if IEEE else "tf32"
    col_ok = cols < N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if TMA:
        # whole tiles (CIN_P == CIN, N_P == N): the copy engine fetches each box, rows before
        # the start or past the end of the batch row come back as zeros (the padding)
        row0 = pid_m * BLOCK_M - PAD
        for it in range(0, TAPS * CIN, BLOCK_K):
            tap = it // CIN
            a = x_desc.load([b32, row0 + tap * DIL, it - tap * CIN]).reshape(BLOCK_M, BLOCK_K)
            w = w_desc.load([it, pid_n * BLOCK_N])
            acc = tl.dot(a, w, acc, input_precision=precision)
    else:
        for it in range(0, TAPS * CIN_P, BLOCK_K):
            # a tap's channels padded to CIN_P (a whole number of BLOCK_K): masks only where the
            # channel count or the columns are not whole tiles, none at a decoder's widths
            tap = it // CIN_P
            c = it - tap * CIN_P + ks
            src = q + tap * DIL - PAD
            a_mask = (src >= 0) & (src < L_in)
            if CIN_P != CIN:
                a_mask = a_mask[:, None] & (c < CIN)[None, :]
                w_offs = (tap * CIN + c)[:, None] * N + cols[None, :]
            else:
                a_mask = a_mask[:, None]
                w_offs = (it + ks)[:, None] * N + cols[None, :]
            a = tl.load(
                x_base + src[:, None] * CIN + c[None, :],
                mask=a_mask,
                other=0.0,
                cache_modifier=A_CACHE,
            )
            if CIN_P != CIN or N_P != N:
                w_mask = (c < CIN)[:, None] & col_ok[None, :]
                w = tl.load(weight + w_offs, mask=w_mask, other=0.0, cache_modifier=W_CACHE)
            else:
                w = tl.load(weight + w_offs, cache_modifier=W_CACHE)
            acc = tl.dot(a, w, acc, input_precision=precision)

    out_dtype = x.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if POINTWISE:
        # the 1x1 convolution needs the whole row of channels: the plan makes BLOCK_N == N_P
        y = acc.to(out_dtype).to(tl.float32)
        h = _snake(
            y,
            tl.load(pw_alpha + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :],
            tl.load(pw_inv_beta + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :],
            FAST_SIN,
        )
        w2_mask = col_ok[:, None] & col_ok[None, :]
        w2 = tl.load(pw_weight + cols[:, None] * N + cols[None, :], mask=w2_mask, other=0.0)
        acc = tl.dot(h.to(out_dtype), w2, input_precision=precision)
        if PW_BIAS:
            acc += tl.load(pw_bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]

    t = q[:, None] * PHASES + (cols // COUT)[None, :] - SHIFT
    ch = cols % COUT
    ok = (t >= 0) & (t < L_out) & col_ok[None, :] & (q < rows)[:, None]
    offs = b * L_out * COUT + t * COUT + ch[None, :]
    if RESIDUAL:
        acc += tl.load(residual + offs, mask=ok, other=0.0).to(tl.float32)
    y = acc.to(out_dtype)
    if STORE_OUT:
        tl.store(out + offs, y, mask=ok)
    if STORE_SNAKE or HEAD:
        s = _snake(
            y.to(tl.float32),
            tl.load(out_alpha + ch).to(tl.float32)[None, :],
            tl.load(out_inv_beta + ch).to(tl.float32)[None, :],
            FAST_SIN,
        ).to(out_dtype)
        if STORE_SNAKE:
            tl.store(snake_out + offs, s, mask=ok)
        if HEAD:
            # the plan makes BLOCK_N == N_P, PHASES == 1 and SHIFT == 0: row q is time q;
            # column tap·HEAD_C + c of the head's taps side by side
            hcol = tl.arange(0, HEAD_P)
            htap = hcol // HEAD_C
            h_offs = (
                htap[None, :] * (COUT * HEAD_C)
                + cols[:, None] * HEAD_C
                + (hcol - htap * HEAD_C)[None, :]
            )
            h_mask = col_ok[:, None] & (hcol < HEAD_TAPS * HEAD_C)[None, :]
            hw = tl.load(head_weight + h_offs, mask=h_mask, other=0.0)
            # in float32: a third half-precision dot of N = 16 chained after the 1x1 one came out
            # wrong at 128 channels (Triton 3.6, H100); the operands hold bf16/fp16 values, which
            # tf32 represents exactly, so the products are the same
            part = tl.dot(s.to(tl.float32), hw.to(tl.float32), input_precision=precision)
            row_ok = (q < L_out)[:, None]
            tl.store(partial + (b * L_out + q[:, None]) * HEAD_P + hcol[None, :], part, mask=row_ok)


# fmt: off
@triton.jit(do_not_specialize=["DIL", "PAD"])
def snake_conv_kernel(
    x, weight, bias, pw_weight, pw_bias, pw_alpha, pw_inv_beta, out_alpha, out_inv_beta,
    head_weight, residual, out, snake_out, partial, x_desc, w_desc, L_in, L_out, rows, batch,
    CIN: tl.constexpr, CIN_P: tl.constexpr, N: tl.constexpr, N_P: tl.constexpr,
    COUT: tl.constexpr, TAPS: tl.constexpr, DIL, PAD,
    PHASES: tl.constexpr, SHIFT: tl.constexpr, HAS_BIAS: tl.constexpr, POINTWISE: tl.constexpr,
    PW_BIAS: tl.constexpr, RESIDUAL: tl.constexpr, STORE_OUT: tl.constexpr,
    STORE_SNAKE: tl.constexpr, HEAD: tl.constexpr, HEAD_TAPS: tl.constexpr, HEAD_C: tl.constexpr,
    HEAD_P: tl.constexpr, FAST_SIN: tl.constexpr, IEEE: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, A_CACHE: tl.constexpr,
    W_CACHE: tl.constexpr, PERSISTENT: tl.constexpr,
):
    """A layer's launch, arguments as :func:`_conv_tile` takes them: one program per tile (grid
    ``(row blocks, column blocks, batch)``), or with ``PERSISTENT`` a program per SM slot that
    walks the tiles, columns fastest (a row block's tiles are neighbours in time and share its
    activations in L2). That loop is flattened, so the pipeliner issues the next tile's first
    loads during this tile's epilogue: most of a tile's time where the main loop is a few K steps
    (transposed and 1x1 layers). The grid launch keeps its own code path: the same body inside a
    one-tile loop compiled slower (residual units 10 % on an H100)."""
    if PERSISTENT:
        num_m = tl.cdiv(rows, BLOCK_M)
        num_n: tl.constexpr = N_P // BLOCK_N
        for tile in tl.range(tl.program_id(0), num_m * num_n * batch, tl.num_programs(0),
                             flatten=True):
            _conv_tile(
                (tile // num_n) % num_m, tile % num_n, tile // (num_n * num_m),
                x, weight, bias, pw_weight, pw_bias, pw_alpha, pw_inv_beta, out_alpha,
                out_inv_beta, head_weight, residual, out, snake_out, partial, x_desc, w_desc,
                L_in, L_out, rows, CIN, CIN_P, N, N_P, COUT, TAPS, DIL, PAD, PHASES, SHIFT,
                HAS_BIAS, POINTWISE, PW_BIAS, RESIDUAL, STORE_OUT, STORE_SNAKE, HEAD, HEAD_TAPS,
                HEAD_C, HEAD_P, FAST_SIN, IEEE, TMA, BLOCK_M, BLOCK_N, BLOCK_K, A_CACHE, W_CACHE,
            )
    else:
        _conv_tile(
            tl.program_id(0), tl.program_id(1), tl.program_id(2),
            x, weight, bias, pw_weight, pw_bias, pw_alpha, pw_inv_beta, out_alpha, out_inv_beta,
            head_weight, residual, out, snake_out, partial, x_desc, w_desc, L_in, L_out, rows,
            CIN, CIN_P, N, N_P, COUT, TAPS, DIL, PAD, PHASES, SHIFT, HAS_BIAS, POINTWISE, PW_BIAS,
            RESIDUAL, STORE_OUT, STORE_SNAKE, HEAD, HEAD_TAPS, HEAD_C, HEAD_P, FAST_SIN, IEEE,
            TMA, BLOCK_M, BLOCK_N, BLOCK_K, A_CACHE, W_CACHE,
        )
# fmt: on


@triton.jit
def tap_sum_kernel(
    partial_ptr,  # (B, L, HEAD_P) float32: column tap·C + c
    bias_ptr,  # (C,)
    out_ptr,  # (B, L, C)
    L,
    C: tl.constexpr,
    C_P: tl.constexpr,
    HEAD_P: tl.constexpr,
    TAPS: tl.constexpr,
    DIL: tl.constexpr,
    PAD: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """``out[b, t, c] = bias[c] + Σ_tap partial[b, t + tap·DIL − PAD, tap·C + c]`` (rows outside
    ``[0, L)`` are the convolution's zero padding)."""
    b = tl.program_id(1).to(tl.int64)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.arange(0, C_P)
    acc = tl.zeros((BLOCK_T, C_P), dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + c, mask=c < C, other=0.0).to(tl.float32)[None, :]
    for tap in tl.static_range(TAPS):
        src = t + tap * DIL - PAD
        ok = ((src >= 0) & (src < L))[:, None] & (c < C)[None, :]
        offs = (b * L + src[:, None]) * HEAD_P + tap * C + c[None, :]
        acc += tl.load(partial_ptr + offs, mask=ok, other=0.0)
    keep = (t < L)[:, None] & (c < C)[None, :]
    tl.store(
        out_ptr + (b * L + t[:, None]) * C + c[None, :], acc.to(out_ptr.dtype.element_ty), mask=keep
    )
