"""Triton building blocks of the MaxSim forward kernels and the fused top-k: the similarities of a
block of query rows with one document tile, folded into a running best, and each row's best (and
first argmax) over one document's tiles."""

from __future__ import annotations

import triton
import triton.language as tl

from .running_max import max_nan


@triton.jit
def tile_similarity(
    q, q_scale, D, DDESC, DM, doc, d_start, d_len, ld, dim, k, k_ok, j0,
    TMA: tl.constexpr, MASKED: tl.constexpr, HAS_DM: tl.constexpr, UPCAST: tl.constexpr, NORMALIZE: tl.constexpr,
    NORM_EPS: tl.constexpr, IEEE: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Similarities of the query rows with document columns ``[j0, j0 + BLOCK_D)`` (``-inf`` where
    a column is past the document or masked) and the column indices. ``MASKED``: the tile may run
    past the document (the last one); full tiles skip the bound checks, which are a third of the
    elementwise work per similarity. ``TMA``: the tile comes through the tensor descriptor
    ``DDESC`` (rows past the document belong to the next one, or are zeros past the tensor: both
    masked like any column past ``d_len``)."""
    cols = j0 + tl.arange(0, BLOCK_D)
    if TMA:
        x = DDESC.load([(d_start + j0).to(tl.int32), 0]).T
        if MASKED:
            col_ok = cols < d_len
        else:
            col_ok = cols >= 0
    else:
        # a 64-bit base per tile and the tile's own 32-bit offsets, the same for every tile:
        # 64-bit address arithmetic per element was 15 % of the read-bound loop's instructions
        local = tl.arange(0, BLOCK_D)[None, :] * dim + k[:, None]
        tile = D + (d_start + j0) * dim + local
        if MASKED:
            col_ok = cols < d_len
            if EVEN_K:
                x_ok = col_ok[None, :]
            else:
                x_ok = col_ok[None, :] & k_ok[:, None]
            x = tl.load(tile, mask=x_ok, other=0.0)
        elif EVEN_K:
            col_ok = cols >= 0
            x = tl.load(tile)
        else:
            col_ok = cols >= 0
            x = tl.load(tile, mask=k_ok[:, None], other=0.0)
    if UPCAST:
        x = x.to(tl.float32)
    if HAS_DM:
        col_ok = col_ok & (tl.load(DM + doc.to(tl.int64) * ld + cols, mask=col_ok, other=0) != 0)
    if IEEE:
        s = tl.dot(q, x, input_precision="ieee")
    else:
        s = tl.dot(q, x)
    if NORMALIZE:
        # cosine from the raw dot product: no normalised copy of Q or D is ever written
        x32 = x.to(tl.float32)
        x_scale = 1.0 / tl.maximum(tl.sqrt(tl.sum(x32 * x32, 0)), NORM_EPS)
        s = s * q_scale[:, None] * x_scale[None, :]
    if MASKED or HAS_DM:
        s = tl.where(col_ok[None, :], s, float("-inf"))
    return s, cols


@triton.jit
def fold_tile(
    q, q_scale, D, DDESC, DM, doc, d_start, d_len, ld, dim, k, k_ok, j0, best, best_col,
    TMA: tl.constexpr, MASKED: tl.constexpr, HAS_DM: tl.constexpr, SAVE_ARGMAX: tl.constexpr,
    UPCAST: tl.constexpr, NORMALIZE: tl.constexpr, NORM_EPS: tl.constexpr, IEEE: tl.constexpr,
    EVEN_K: tl.constexpr, TILE_MAX: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Fold one document tile into the running best. ``TILE_MAX``: ``best``/``best_col`` are
    ``(BLOCK_Q, BLOCK_D)`` (one max per row and column slot, reduced once per document, so a tile
    costs one ``max`` per similarity and no cross-thread reduction); otherwise ``(BLOCK_Q,)``,
    reduced per tile. ``best_col`` holds the first column reaching the best."""
    s, cols = tile_similarity(
        q, q_scale, D, DDESC, DM, doc, d_start, d_len, ld, dim, k, k_ok, j0,
        TMA, MASKED, HAS_DM, UPCAST, NORMALIZE, NORM_EPS, IEEE, EVEN_K, BLOCK_D,
    )  # fmt: skip
    if TILE_MAX:
        if SAVE_ARGMAX:
            best_col = tl.where(s > best, cols[None, :], best_col)
        best = max_nan(best, s)
    else:
        tile_best = tl.reduce(s, 1, max_nan)
        if SAVE_ARGMAX:
            first = tl.min(tl.where(s == tile_best[:, None], cols[None, :], 2147483647), 1)
            best_col = tl.where(tile_best > best, first, best_col)
        best = max_nan(best, tile_best)
    return best, best_col


@triton.jit
def best_over_document(
    q, q_scale, D, DDESC, DM, doc, d_start, d_len, d_stop, ld, dim, k, k_ok,
    TMA: tl.constexpr, HAS_DM: tl.constexpr, SAVE_ARGMAX: tl.constexpr, UPCAST: tl.constexpr,
    NORMALIZE: tl.constexpr, NORM_EPS: tl.constexpr, IEEE: tl.constexpr, EVEN_K: tl.constexpr,
    DYNAMIC_BOUNDS: tl.constexpr, TILE_MAX: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr, ONE_LOOP: tl.constexpr = False,
):  # fmt: skip
    """Each query row's best similarity over one document's tokens (``-inf`` when no token is
    valid) and, with ``SAVE_ARGMAX``, the first column reaching it. On the GPU the document's full
    tiles run unmasked and only a last partial tile is masked; the interpreter (static loop
    bounds) masks every tile. ``ONE_LOOP``: every tile masked in one loop, so the last tile's
    load is pipelined with the others (read-bound shapes: few query rows per document)."""
    if TILE_MAX:
        best = tl.full((BLOCK_Q, BLOCK_D), float("-inf"), dtype=tl.float32)
        best_col = tl.zeros((BLOCK_Q, BLOCK_D), dtype=tl.int32)
    else:
        best = tl.full((BLOCK_Q,), float("-inf"), dtype=tl.float32)
        best_col = tl.zeros((BLOCK_Q,), dtype=tl.int32)
    if DYNAMIC_BOUNDS and not ONE_LOOP:
        d_full = (d_len // BLOCK_D) * BLOCK_D
    else:
        d_full = 0
    for j0 in range(0, d_full, BLOCK_D):
        best, best_col = fold_tile(
            q, q_scale, D, DDESC, DM, doc, d_start, d_len, ld, dim, k, k_ok, j0, best, best_col,
            TMA, False, HAS_DM, SAVE_ARGMAX, UPCAST, NORMALIZE, NORM_EPS, IEEE, EVEN_K, TILE_MAX,
            BLOCK_D,
        )  # fmt: skip
    for j0 in range(d_full, d_stop, BLOCK_D):
        best, best_col = fold_tile(
            q, q_scale, D, DDESC, DM, doc, d_start, d_len, ld, dim, k, k_ok, j0, best, best_col,
            TMA, True, HAS_DM, SAVE_ARGMAX, UPCAST, NORMALIZE, NORM_EPS, IEEE, EVEN_K, TILE_MAX,
            BLOCK_D,
        )  # fmt: skip
    if TILE_MAX:
        row_best = tl.reduce(best, 1, max_nan)
        if SAVE_ARGMAX:
            # the slot holding the row's best with the smallest column is the first column
            # reaching it (each slot keeps its own first); a NaN row matches no slot and points at
            # column 0, like the per-tile fold
            first = tl.min(tl.where(best == row_best[:, None], best_col, 2147483647), 1)
            row_col = tl.where(first == 2147483647, 0, first)
        else:
            row_col = tl.zeros((BLOCK_Q,), dtype=tl.int32)
        best = row_best
        best_col = row_col
    return best, best_col
