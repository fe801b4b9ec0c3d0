"""Triton helpers shared by the MaxSim kernels: the NaN-propagating max, and the running best over
document tiles that the fused head kernels (``maxsim_from_hidden``, ``maxsim_residual``) keep per
(query token, document) in a scratch buffer.

Those kernels build each document tile once (projected or decompressed in registers) and score it
against every query token of the batch, so the running state cannot live in registers across
tiles: it lives in ``BEST`` / ``ARGMAX``, owned by the program that owns the document (plain loads
and stores, no atomics), and the first tile starts it without a clearing pass.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def max_nan(a, b):
    # NaN wins, so a NaN similarity reaches the score instead of being skipped by the max
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def score_tile_into_running_max(
    Q, tile_t, cols, col_ok, BEST, ARGMAX,
    q_rows, lq, dim, query_stride, pair_offset, continuing, index_base,
    SAVE_ARGMAX: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Score ``tile_t`` (``(BLOCK_K, BLOCK_T)``, a document tile transposed) against all ``q_rows``
    query-token rows of ``Q`` and fold each row's tile maximum into the scratch at
    ``(row // lq) * query_stride + pair_offset + row % lq``. ``continuing`` is False on the
    document's first tile (its state starts from ``-inf``); the argmax stored is
    ``index_base +`` the first column reaching the best."""
    k = tl.arange(0, BLOCK_K)
    k_ok = k < dim
    for r0 in range(0, q_rows, BLOCK_Q):
        r = r0 + tl.arange(0, BLOCK_Q)
        row_ok = r < q_rows
        q = tl.load(
            Q + r.to(tl.int64)[:, None] * dim + k[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        if UPCAST:
            q = q.to(tl.float32)
        if IEEE:
            s = tl.dot(q, tile_t, input_precision="ieee")
        else:
            s = tl.dot(q, tile_t)
        s = tl.where(col_ok[None, :], s, float("-inf"))
        tile_best = tl.reduce(s, 1, max_nan)
        slot = (r // lq).to(tl.int64) * query_stride + pair_offset + r % lq
        carry = row_ok & continuing
        best = tl.load(BEST + slot, mask=carry, other=float("-inf"))
        tl.store(BEST + slot, max_nan(best, tile_best), mask=row_ok)
        if SAVE_ARGMAX:
            first = tl.min(tl.where(s == tile_best[:, None], cols[None, :], 2147483647), 1)
            idx = tl.load(ARGMAX + slot, mask=carry, other=0)
            winner = tl.where(tile_best > best, index_base + first, idx)
            tl.store(ARGMAX + slot, winner, mask=row_ok)
