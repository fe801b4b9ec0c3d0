"""Triton kernel of PLAID's candidate-pruning score (``plaid_approx_score``).

One program per document: it walks the document's codes in tiles of ``BLOCK_L``, gathers the
centroid-score rows of those codes (``(BLOCK_L, BLOCK_Q)`` from the ``(n_centroids, Lq)`` table,
which stays in L2 for real centroid counts) and keeps a running maximum per query token. Nothing of
size ``(B, Ld, Lq)`` is ever written, where the PyTorch path gathers it chunk by chunk.

The reference's value rules: positions at or past the document's length never count; a code
outside ``[0, n_centroids)`` reads centroid 0; a query token whose maximum is not finite (NaN among
the document's scores, ±inf, or an empty document) adds 0. GPU ``max`` drops NaN, so NaN is tracked
on the side.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def plaid_approx_score_kernel(
    QCS,  # (n_centroids, lq) float, row stride stride_c
    CODES,  # (B, max_ld) integer, row stride stride_b
    LENGTHS,  # (B,) integer
    OUT,  # (B,) float32
    n_centroids,
    lq,
    max_ld,
    stride_c,
    stride_b,
    BLOCK_L: tl.constexpr,
    BLOCK_Q: tl.constexpr,
):
    doc = tl.program_id(0)
    length = tl.load(LENGTHS + doc).to(tl.int32)
    length = tl.minimum(tl.maximum(length, 0), max_ld)
    code_row = CODES + doc.to(tl.int64) * stride_b
    total = tl.zeros([BLOCK_Q], tl.float32)
    for q0 in range(0, lq, BLOCK_Q):
        qq = q0 + tl.arange(0, BLOCK_Q)
        q_ok = qq < lq
        best = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        nan_seen = tl.zeros([BLOCK_Q], tl.int32)
        for l0 in range(0, length, BLOCK_L):
            ll = l0 + tl.arange(0, BLOCK_L)
            l_ok = ll < length
            code = tl.load(code_row + ll, mask=l_ok, other=0).to(tl.int64)
            code = tl.where((code >= 0) & (code < n_centroids), code, 0)
            ok = l_ok[:, None] & q_ok[None, :]
            s = tl.load(QCS + code[:, None] * stride_c + qq[None, :], mask=ok, other=float("-inf"))
            s = s.to(tl.float32)
            nan_seen = tl.maximum(nan_seen, tl.max(((s != s) & ok).to(tl.int32), axis=0))
            best = tl.maximum(best, tl.max(tl.where(s != s, float("-inf"), s), axis=0))
        finite = (nan_seen == 0) & (best > float("-inf")) & (best < float("inf"))
        total += tl.where(finite & q_ok, best, 0.0)
    tl.store(OUT + doc, tl.sum(total, axis=0))
