"""Triton kernel of FP8 MaxSim inference.

A program scores a block of query tokens (several short queries stacked, or one block of
``BLOCK_Q`` tokens of a long query) against a run of documents, tiles of ``BLOCK_D`` document
tokens at a time, one ``tl.dot`` on the stored 8-bit operands with a float32
accumulator; queries longer than one block write one partial score per block, summed afterwards. The same kernel runs fp16/fp32 operands, which is how the Triton interpreter (it
has no 8-bit floats) tests the tiling, masking and scale handling on CPU.

At 8 bits the tensor cores are fast enough that the per-element work after the dot decides the
speed, so the kernel keeps it to one instruction where it can:

* the running maximum is elementwise over the ``(BLOCK_Q, BLOCK_D)`` tile (one NaN-propagating
  ``max`` per element) and is reduced over the document axis once per document, not per tile;
* per-tensor scales and the query's per-token scale are applied after that reduction (a valid
  scale is ``>= 0``, so it commutes with the maximum); only a per-token document scale multiplies
  every element;
* with per-token document scales and short documents the tile is transposed,
  ``(BLOCK_D, query rows)``: a 32-token query is then the dot's N, not an M too small for
  Hopper's warpgroup MMA, and each thread multiplies by the scales of two or four rows instead
  of a slice of columns.

A scale that is negative, NaN or infinite is read as NaN, so every score that uses it is NaN
(``reference.valid_scale`` is the same rule in PyTorch). Long documents check their tokens'
scales once per document rather than per tile.
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_dispatch import autotune, config_space

from ..maxsim.running_max import max_nan
from ..tiles import dot_rows, load_rows

# Tuned per (query tile, embedding tile, scale kind): the best document tile and warp count move
# with the register footprint of the (BLOCK_Q, BLOCK_D) accumulator.
_CONFIGS = config_space({"BLOCK_D": [32, 64, 128]}, num_warps=[4, 8], num_stages=[3])
_INTERPRET_CONFIG = triton.Config({"BLOCK_D": 16}, num_warps=4, num_stages=1)


@triton.jit
def _valid_scale(s):
    # x - x is 0 only for finite x: inf, NaN and negative scales become NaN
    return tl.where((s - s == 0) & (s >= 0), s, float("nan"))


@triton.jit
def _along_tokens(v, TRANS: tl.constexpr):
    """A vector over the tile's document tokens, broadcast against the similarity tile."""
    if TRANS:
        out = v[:, None]
    else:
        out = v[None, :]
    return out


@triton.jit
def _fold_tile(
    acc, q, D, DDESC, SD, DM, j, t0, ld, dim, cols, ks, k_ok,
    D_PER_TOKEN: tl.constexpr, HAS_DM: tl.constexpr, MASKED: tl.constexpr, IEEE: tl.constexpr,
    TMA: tl.constexpr, TRANS: tl.constexpr, SCALES_CHECKED: tl.constexpr,
):  # fmt: skip
    t = t0 + cols
    t_ok = t < ld
    if TMA:  # rows past the document are the next one's (or zeros): masked below like any other
        x = DDESC.load([(j * ld + t0).to(tl.int32), 0])
    else:
        x = load_rows(D, j * ld + t, t_ok, ks, k_ok, dim, False)
    if TRANS:
        s = dot_rows(x, q, IEEE)
    else:
        s = dot_rows(q, x, IEEE)
    if D_PER_TOKEN:
        sd = tl.load(SD + j * ld + t, mask=t_ok, other=0.0)
        if not SCALES_CHECKED:
            sd = _valid_scale(sd)
        if MASKED and not HAS_DM and not TMA:
            # The bound mask rides on the scale's multiply as an addend, one FMA per element
            # instead of a multiply and a select: a token past the document was loaded as zeros
            # with scale 0, so its similarity is 0 * 0 - inf = -inf; inside it adds 0.
            bias = tl.where(t_ok, 0.0, float("-inf"))
            s = s * _along_tokens(sd, TRANS) + _along_tokens(bias, TRANS)
            return max_nan(acc, s)
        s = s * _along_tokens(sd, TRANS)
    if HAS_DM:
        t_ok = t_ok & (tl.load(DM + j * ld + t, mask=t_ok, other=0) != 0)
    if MASKED or HAS_DM:
        s = tl.where(_along_tokens(t_ok, TRANS), s, float("-inf"))
    # NaN wins, so a NaN token or scale reaches the score as it does in the reference
    return max_nan(acc, s)


@triton.jit
def _document_scales_bad(SD, DM, j, ld, HAS_DM: tl.constexpr, BLOCK: tl.constexpr):
    """Whether a live token of document ``j`` has an invalid scale (the nested loop multiplies
    by the raw scales and turns the whole document's similarities into NaN afterwards: checking
    each tile's scales in the tile's layout costs as much as the multiply itself)."""
    bad = tl.zeros([BLOCK], tl.int32)
    for t0 in range(0, ld, BLOCK):
        t = t0 + tl.arange(0, BLOCK)
        live = t < ld
        if HAS_DM:
            live = live & (tl.load(DM + j * ld + t, mask=live, other=0) != 0)
        sd = tl.load(SD + j * ld + t, mask=live, other=0.0)
        bad = tl.maximum(bad, tl.where(live & (_valid_scale(sd) != sd), 1, 0))
    return tl.max(bad, 0) > 0


@triton.jit
def _fp8_program(
    Q, D, DDESC, SQ, SD, QM, DM, OUT,
    nq, nd, lq, ld, dim, docs_per_prog,
    Q_PER_TOKEN: tl.constexpr, D_PER_TOKEN: tl.constexpr, HAS_QM: tl.constexpr,
    HAS_DM: tl.constexpr, IEEE: tl.constexpr, FLAT: tl.constexpr, QUERIES: tl.constexpr,
    TMA: tl.constexpr, TRANS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    # program (g * query_blocks + b, p): token block b of the QUERIES queries of group g (their
    # tokens stacked into one tile, so each document tile is read once for all of them) against
    # the p-th run of documents; it writes OUT[query * query_blocks + b, j] for each document j
    iq = tl.program_id(0)
    p = tl.program_id(1)
    query_blocks = tl.cdiv(lq, BLOCK_Q)
    g = iq // query_blocks
    b = iq - g * query_blocks
    r = tl.arange(0, QUERIES * BLOCK_Q)
    query = g * QUERIES + r // BLOCK_Q
    token = b * BLOCK_Q + r % BLOCK_Q
    row_ok = (token < lq) & (query < nq)
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < dim
    cols = tl.arange(0, BLOCK_D)
    q_rows = query.to(tl.int64) * lq + token
    q = load_rows(Q, q_rows, row_ok, ks, k_ok, dim, False)
    if Q_PER_TOKEN:
        scale = _valid_scale(tl.load(SQ + q_rows, mask=row_ok, other=0.0))
    else:
        scale = tl.zeros([QUERIES * BLOCK_Q], tl.float32) + _valid_scale(tl.load(SQ))
    if not D_PER_TOKEN:
        scale = scale * _valid_scale(tl.load(SD))
    live = row_ok
    if HAS_QM:
        live = live & (tl.load(QM + q_rows, mask=row_ok, other=0) != 0)
    qs = g * QUERIES + tl.arange(0, QUERIES)
    out_rows = (qs.to(tl.int64) * query_blocks + b) * nd
    out_ok = qs < nq
    # int64 document offsets: Nd * Ld * d passes 2**31 on large collections
    start = p.to(tl.int64) * docs_per_prog
    count = tl.minimum(start + docs_per_prog, nd) - start
    acc = _empty_tile(QUERIES * BLOCK_Q, BLOCK_D, TRANS)
    if FLAT:
        # short documents: (document, tile) pairs as one loop, so the software pipeline prefetches
        # the next document's first tile while the current document finishes
        n_tiles = tl.cdiv(ld, BLOCK_D)
        for step in range(0, count * n_tiles):
            jj = step // n_tiles
            t0 = (step - jj * n_tiles) * BLOCK_D
            j = start + jj
            acc = _fold_tile(
                acc, q, D, DDESC, SD, DM, j, t0, ld, dim, cols, ks, k_ok, D_PER_TOKEN, HAS_DM,
                True, IEEE, TMA, TRANS, False,
            )  # fmt: skip
            if t0 + BLOCK_D >= ld:  # the document's last tile: its maxima are complete
                best = _reduce_tokens(acc, TRANS)
                _store_scores(OUT, best, scale, live, out_rows + j, out_ok, QUERIES, BLOCK_Q)
                acc = _empty_tile(QUERIES * BLOCK_Q, BLOCK_D, TRANS)
    else:
        # long documents: whole tiles without the column mask (per-token scales make the mask a
        # second per-element pass), then the partial last tile
        full = (ld // BLOCK_D) * BLOCK_D
        for jj in range(0, count):
            j = start + jj
            for t0 in range(0, full, BLOCK_D):
                acc = _fold_tile(
                    acc, q, D, DDESC, SD, DM, j, t0, ld, dim, cols, ks, k_ok, D_PER_TOKEN, HAS_DM,
                    False, IEEE, TMA, TRANS, D_PER_TOKEN,
                )  # fmt: skip
            if full < ld:
                acc = _fold_tile(
                    acc, q, D, DDESC, SD, DM, j, full, ld, dim, cols, ks, k_ok, D_PER_TOKEN,
                    HAS_DM, True, IEEE, TMA, TRANS, D_PER_TOKEN,
                )  # fmt: skip
            best = _reduce_tokens(acc, TRANS)
            if D_PER_TOKEN:
                bad = _document_scales_bad(SD, DM, j, ld, HAS_DM, 256)
                best = tl.where(bad, float("nan"), best)
            _store_scores(OUT, best, scale, live, out_rows + j, out_ok, QUERIES, BLOCK_Q)
            acc = _empty_tile(QUERIES * BLOCK_Q, BLOCK_D, TRANS)


@autotune(
    _CONFIGS,
    key=["QUERIES", "BLOCK_Q", "BLOCK_K", "D_PER_TOKEN", "HAS_DM", "FLAT"],
    interpret_config=_INTERPRET_CONFIG,
)
@triton.jit
def fp8_maxsim_kernel(
    Q, D, SQ, SD, QM, DM, OUT,
    nq, nd, lq, ld, dim, docs_per_prog,
    Q_PER_TOKEN: tl.constexpr, D_PER_TOKEN: tl.constexpr, HAS_QM: tl.constexpr,
    HAS_DM: tl.constexpr, IEEE: tl.constexpr, FLAT: tl.constexpr, QUERIES: tl.constexpr,
    TRANS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """``TRANS``: the tile is computed as ``(document tokens, query rows)``, so the dot's M is the
    document tile (short queries then fill Hopper's 64-row warpgroup MMA) and a per-token document
    scale is one value per accumulator row."""
    _fp8_program(
        Q, D, None, SQ, SD, QM, DM, OUT, nq, nd, lq, ld, dim, docs_per_prog, Q_PER_TOKEN,
        D_PER_TOKEN, HAS_QM, HAS_DM, IEEE, FLAT, QUERIES, False, TRANS, BLOCK_Q, BLOCK_D,
        BLOCK_K,
    )  # fmt: skip


@triton.jit
def fp8_maxsim_tma_kernel(
    Q, D, DDESC, SQ, SD, QM, DM, OUT,
    nq, nd, lq, ld, dim, docs_per_prog,
    Q_PER_TOKEN: tl.constexpr, D_PER_TOKEN: tl.constexpr, HAS_QM: tl.constexpr,
    HAS_DM: tl.constexpr, IEEE: tl.constexpr, FLAT: tl.constexpr, QUERIES: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The Hopper path for short documents: document tiles through a TMA tensor descriptor
    ``DDESC`` (at 8 bits the address arithmetic of pointer loads cost more issue slots than the
    dot), one config (the package's ``TMA_BLOCK_D`` and ``TMA_OPTIONS``)."""
    _fp8_program(
        Q, D, DDESC, SQ, SD, QM, DM, OUT, nq, nd, lq, ld, dim, docs_per_prog, Q_PER_TOKEN,
        D_PER_TOKEN, HAS_QM, HAS_DM, IEEE, FLAT, QUERIES, True, False, BLOCK_Q, BLOCK_D, BLOCK_K,
    )  # fmt: skip


@triton.jit
def _empty_tile(ROWS: tl.constexpr, BLOCK_D: tl.constexpr, TRANS: tl.constexpr):
    if TRANS:
        tile = tl.full([BLOCK_D, ROWS], float("-inf"), tl.float32)
    else:
        tile = tl.full([ROWS, BLOCK_D], float("-inf"), tl.float32)
    return tile


@triton.jit
def _reduce_tokens(acc, TRANS: tl.constexpr):
    """Each query row's best over the tile's document-token slots."""
    if TRANS:
        best = tl.reduce(acc, 0, max_nan)
    else:
        best = tl.reduce(acc, 1, max_nan)
    return best


@triton.jit
def _store_scores(OUT, best, scale, live, where, ok, QUERIES: tl.constexpr, BLOCK_Q: tl.constexpr):
    # a query token with no valid document token adds 0, whatever its scale
    per_token = tl.where(live & (best != float("-inf")), best * scale, 0.0)
    tl.store(OUT + where, tl.sum(tl.reshape(per_token, [QUERIES, BLOCK_Q]), 1), mask=ok)
