"""Triton kernels of ``maxsim_residual``: score residual-compressed documents by decompressing
them in registers, and gather the query gradient from the winning tokens.

Forward: one program owns one document. It streams the document's tokens in ``BLOCK_T`` tiles:
centroid rows gathered by code, bucket indices unpacked from the packed bytes, bucket weights
added, every token L2-normalised; then it scores the tile against all query tokens of the batch,
``BLOCK_Q`` rows per ``tl.dot``, keeping the running max (and argmax, when gradients are needed) of
every (query token, document) in an fp32 scratch only this program touches (read-modify-write, no
atomics). Each tile is decompressed once, whatever the number of queries, and decompressed tokens
exist only in registers. Per-query sums over the scratch are taken afterwards.

Backward: ``grad_Q[i, q] = sum_j g[i, j] · token(argmax[i, j, q])``; one program owns a block of
one query's tokens and a slice of the documents, decompresses only the winning tokens, and adds its
fp32 sum into ``grad_Q`` with atomics (documents are split across programs to fill the GPU).
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_dispatch import autotune, config_space

from ..common.running_max import score_tile_into_running_max
from ..common.tuning import tuning_bench

#: ``torch.nn.functional.normalize``'s floor on a token's norm.
NORM_EPS = 1e-12

# a small space: each shape regime (query padding, block, nbits) compiles every config once
_FWD_CONFIGS = config_space(
    {"BLOCK_T": [32, 64], "BLOCK_Q": [64, 128]}, num_warps=[4, 8], num_stages=[2]
)
_FWD_DEFAULT = triton.Config({"BLOCK_T": 64, "BLOCK_Q": 64}, num_warps=4, num_stages=2)
_FWD_INTERPRET = triton.Config({"BLOCK_T": 16, "BLOCK_Q": 16}, num_warps=4, num_stages=1)
_BWD_CONFIGS = config_space({"BLOCK_Q": [16, 32]}, num_warps=[4, 8], num_stages=[1])
_BWD_DEFAULT = triton.Config({"BLOCK_Q": 32}, num_warps=4, num_stages=1)
_BWD_INTERPRET = triton.Config({"BLOCK_Q": 16}, num_warps=4, num_stages=1)


@triton.jit
def decompress_tile(
    C, CODES, PACKED, WEIGHTS, tok, tok_ok, dim, width,
    NBITS: tl.constexpr, NORM_EPS: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """``(len(tok), BLOCK_K)`` fp32 tokens ``normalize(centroids[code] + weights[bucket])``;
    rows with ``tok_ok`` False and columns past ``dim`` are 0.

    Dimension ``j``'s ``NBITS`` bits sit at bit positions ``j·NBITS + b`` (``b = 0`` the least
    significant bit of the bucket index), position ``p`` being bit ``7 - p % 8`` of byte ``p // 8``;
    ``NBITS`` divides 8, so one byte holds all of a dimension's bits.
    """
    k = tl.arange(0, BLOCK_K)
    ok = tok_ok[:, None] & (k < dim)[None, :]
    code = tl.load(CODES + tok, mask=tok_ok, other=0).to(tl.int64)
    x = tl.load(C + code[:, None] * dim + k[None, :], mask=ok, other=0.0).to(tl.float32)
    first_bit = k * NBITS
    byte = tl.load(
        PACKED + tok.to(tl.int64)[:, None] * width + (first_bit // 8)[None, :], mask=ok, other=0
    ).to(tl.int32)
    top = (7 - first_bit % 8)[None, :]  # where bit 0 of the bucket index sits in its byte
    bucket = tl.zeros_like(byte)
    for b in tl.static_range(NBITS):
        bucket += ((byte >> (top - b)) & 1) << b
    x += tl.load(WEIGHTS + bucket, mask=ok, other=0.0).to(tl.float32)
    inv = 1.0 / tl.maximum(tl.sqrt(tl.sum(x * x, 1)), NORM_EPS)
    return x * inv[:, None]


@autotune(
    _FWD_CONFIGS,
    key=["Q_BUCKET", "BLOCK_K", "NBITS", "SAVE_ARGMAX"],
    default=_FWD_DEFAULT,
    interpret_config=_FWD_INTERPRET,
    do_bench=tuning_bench,
)
@triton.jit
def residual_fwd_kernel(
    Q, C, CODES, PACKED, WEIGHTS, OFFSETS, BEST, ARGMAX,
    q_rows, n_doc, lq, dim, width, max_len, Q_BUCKET,
    NBITS: tl.constexpr, SAVE_ARGMAX: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    DYNAMIC_BOUNDS: tl.constexpr, NORM_EPS: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    """``BEST[qi, doc, t]``: best similarity of query token ``(qi, t)`` over the document's tokens
    (-inf: none); ``ARGMAX``: the global token row of the first one reaching it."""
    doc = tl.program_id(0)
    d_start = tl.load(OFFSETS + doc).to(tl.int64)
    d_len = (tl.load(OFFSETS + doc + 1) - d_start).to(tl.int32)
    # at least one (fully masked) tile, so an empty document still writes its -inf; the
    # interpreter cannot loop to a bound that comes from a load: it runs the longest document
    if DYNAMIC_BOUNDS:
        stop = tl.maximum(d_len, 1)
    else:
        stop = max_len
    for j0 in range(0, stop, BLOCK_T):
        cols = j0 + tl.arange(0, BLOCK_T)
        col_ok = cols < d_len
        x = decompress_tile(
            C, CODES, PACKED, WEIGHTS, d_start + cols, col_ok, dim, width, NBITS, NORM_EPS, BLOCK_K
        )
        if UPCAST:
            x_t = tl.trans(x)
        else:
            x_t = tl.trans(x.to(Q.dtype.element_ty))
        # the tile is decompressed once and scored against every query token of the batch
        score_tile_into_running_max(
            Q, x_t, cols, col_ok, BEST, ARGMAX,
            q_rows, lq, dim, n_doc * lq, doc.to(tl.int64) * lq, j0 > 0, d_start,
            SAVE_ARGMAX, UPCAST, IEEE, BLOCK_Q, BLOCK_K,
        )  # fmt: skip


@autotune(
    _BWD_CONFIGS,
    key=["BLOCK_K", "NBITS"],
    default=_BWD_DEFAULT,
    reset_to_zero=["GQ"],
    interpret_config=_BWD_INTERPRET,
    do_bench=tuning_bench,
)
@triton.jit
def residual_grad_q_kernel(
    GRAD, ARGMAX, C, CODES, PACKED, WEIGHTS, GQ,
    n_doc, lq, dim, width, docs_per_split,
    NBITS: tl.constexpr, NORM_EPS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_Q: tl.constexpr,
):  # fmt: skip
    """``GQ[i, t] += sum over this program's documents j of GRAD[i, j] · token(ARGMAX[i, j, t])``."""
    qi = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    t_ok = t < lq
    first_doc = tl.program_id(2) * docs_per_split
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_Q, BLOCK_K), dtype=tl.float32)
    for jj in range(0, docs_per_split):
        j = first_doc + jj
        ok = t_ok & (j < n_doc)
        win = tl.load(ARGMAX + (qi * n_doc + j) * lq + t, mask=ok, other=-1)
        won = ok & (win >= 0)
        g = tl.load(GRAD + qi * n_doc + j, mask=j < n_doc, other=0.0).to(tl.float32)
        x = decompress_tile(
            C, CODES, PACKED, WEIGHTS, tl.maximum(win, 0), won, dim, width, NBITS, NORM_EPS, BLOCK_K
        )
        # where(): a token that won nothing adds an exact 0, whatever g is
        acc += tl.where(won[:, None], x * g, 0.0)
    ok = t_ok[:, None] & (k < dim)[None, :]
    tl.atomic_add(GQ + (qi * lq + t)[:, None] * dim + k[None, :], acc, mask=ok)
