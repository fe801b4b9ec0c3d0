"""Triton kernel of FP8 MaxSim inference.

A program scores a block of query tokens (several short queries stacked, or one block of
``BLOCK_Q`` tokens of a long query) against a run of documents, tiles of ``BLOCK_D`` document
tokens at a time, one ``tl.dot`` on the stored 8-bit operands with a float32
accumulator; queries longer than one block write one partial score per block, summed afterwards. The same kernel runs fp16/fp32 operands, which is how the Triton interpreter (it
has no 8-bit floats) tests the tiling, masking and scale handling on CPU.

At 8 bits the tensor cores are fast enough that the per-element work after the dot decides the
speed, so the kernel keeps it to one instruction where it can:

* the running maximum is elementwise over the ``(BLOCK_Q, BLOCK_D)`` tile (one NaN-propagating
  ``max`` per element) and is reduced over the document axis once per document, not per tile
  (``TILE_MAX``). The autotuner may instead take each tile's row maxima: one fp32 tile per
  thread instead of two, so four 4-warp programs fit per SM (H100, 1 × 1000 × 128 × 1024
  per-token: 0.064 against 0.068 ms for the best tile-wide config);
* per-tensor scales and the query's per-token scale are applied after that reduction (a valid
  scale is ``>= 0``, so it commutes with the maximum); only a per-token document scale multiplies
  every element;
* with per-token document scales and short documents the tile is transposed,
  ``(BLOCK_D, query rows)``: a 32-token query is then the dot's N, not an M too small for
  Hopper's warpgroup MMA, and each thread multiplies by the scales of two or four rows instead
  of a slice of columns.

A scale that is negative, NaN or infinite is read as NaN, so every score that uses it is NaN
(``reference.valid_scale`` is the same rule in PyTorch). Long documents check their tokens'
scales once per document rather than per tile, before its first tile: that one read brings the
document's scales into cache for the tiles' reads (H100, same shape, a stand-alone copy of the
loop: 0.0653 against 0.0705 ms with the check after the last tile).
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_dispatch import autotune, config_space

from ..common.running_max import max_nan
from ..common.tiles import dot_rows, load_rows

# Tuned per (query tile, embedding tile, scale kind): the best document tile and warp count move
# with the register footprint of the (BLOCK_Q, BLOCK_D) accumulator.
_CONFIGS = config_space(
    {"BLOCK_D": [32, 64, 128], "TILE_MAX": [False, True]}, num_warps=[4, 8], num_stages=[3]
) + [
    # row maxima need one fp32 tile per thread, not two: capped at 128 registers, four 4-warp
    # programs fit per SM instead of three (no spills at 32- and 64-token tiles)
    triton.Config({"BLOCK_D": block_d, "TILE_MAX": False}, num_warps=4, num_stages=3, maxnreg=128)
    for block_d in (32, 64)
]
_INTERPRET_CONFIG = triton.Config({"BLOCK_D": 16, "TILE_MAX": True}, num_warps=4, num_stages=1)


def _prune(configs, named_args, **kwargs):
    """A transposed tile keeps the tile-wide maximum: its per-tile reduction would run over the
    document-token rows, across warps."""
    if {**named_args, **kwargs}["TRANS"]:
        return [c for c in configs if c.kwargs["TILE_MAX"]]
    return configs


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
    TMA: tl.constexpr, TRANS: tl.constexpr, SCALES_CHECKED: tl.constexpr, TILE_MAX: tl.constexpr,
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
            return _fold(acc, s, TRANS, TILE_MAX)
        s = s * _along_tokens(sd, TRANS)
    if HAS_DM:
        t_ok = t_ok & (tl.load(DM + j * ld + t, mask=t_ok, other=0) != 0)
    if MASKED or HAS_DM:
        s = tl.where(_along_tokens(t_ok, TRANS), s, float("-inf"))
    return _fold(acc, s, TRANS, TILE_MAX)


@triton.jit
def _fold(acc, s, TRANS: tl.constexpr, TILE_MAX: tl.constexpr):
    """The running best after the similarity tile ``s``: elementwise (``TILE_MAX``) or per query
    row. NaN wins, so a NaN token or scale reaches the score as it does in the reference."""
    if TILE_MAX:
        folded = max_nan(acc, s)
    else:
        folded = max_nan(acc, _reduce_tokens(s, TRANS))
    return folded


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
    TMA: tl.constexpr, TRANS: tl.constexpr, TILE_MAX: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
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
    acc = _empty_best(QUERIES * BLOCK_Q, BLOCK_D, TRANS, TILE_MAX)
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
                True, IEEE, TMA, TRANS, False, TILE_MAX,
            )  # fmt: skip
            if t0 + BLOCK_D >= ld:  # the document's last tile: its maxima are complete
                best = _best_per_row(acc, TRANS, TILE_MAX)
                _store_scores(OUT, best, scale, live, out_rows + j, out_ok, QUERIES, BLOCK_Q)
                acc = _empty_best(QUERIES * BLOCK_Q, BLOCK_D, TRANS, TILE_MAX)
    else:
        # long documents: one document at a time. With per-token scales and no document mask the
        # column mask rides on the scale's FMA, so every tile takes it and the tile code exists
        # once (134 registers instead of 168 with row maxima); otherwise the whole tiles skip the
        # mask (it would be a second per-element pass) and the partial last tile follows
        for jj in range(0, count):
            j = start + jj
            if D_PER_TOKEN:
                bad = _document_scales_bad(SD, DM, j, ld, HAS_DM, 256)
            if D_PER_TOKEN and not HAS_DM:
                for t0 in range(0, ld, BLOCK_D):
                    acc = _fold_tile(
                        acc, q, D, DDESC, SD, DM, j, t0, ld, dim, cols, ks, k_ok, D_PER_TOKEN,
                        HAS_DM, True, IEEE, TMA, TRANS, D_PER_TOKEN, TILE_MAX,
                    )  # fmt: skip
            else:
                full = (ld // BLOCK_D) * BLOCK_D
                for t0 in range(0, full, BLOCK_D):
                    acc = _fold_tile(
                        acc, q, D, DDESC, SD, DM, j, t0, ld, dim, cols, ks, k_ok, D_PER_TOKEN,
                        HAS_DM, False, IEEE, TMA, TRANS, D_PER_TOKEN, TILE_MAX,
                    )  # fmt: skip
                if full < ld:
                    acc = _fold_tile(
                        acc, q, D, DDESC, SD, DM, j, full, ld, dim, cols, ks, k_ok, D_PER_TOKEN,
                        HAS_DM, True, IEEE, TMA, TRANS, D_PER_TOKEN, TILE_MAX,
                    )  # fmt: skip
            best = _best_per_row(acc, TRANS, TILE_MAX)
            if D_PER_TOKEN:
                best = tl.where(bad, float("nan"), best)
            _store_scores(OUT, best, scale, live, out_rows + j, out_ok, QUERIES, BLOCK_Q)
            acc = _empty_best(QUERIES * BLOCK_Q, BLOCK_D, TRANS, TILE_MAX)


@autotune(
    _CONFIGS,
    key=["QUERIES", "BLOCK_Q", "BLOCK_K", "D_PER_TOKEN", "HAS_DM", "FLAT"],
    prune=_prune,
    interpret_config=_INTERPRET_CONFIG,
)
@triton.jit
def fp8_maxsim_kernel(
    Q, D, SQ, SD, QM, DM, OUT,
    nq, nd, lq, ld, dim, docs_per_prog,
    Q_PER_TOKEN: tl.constexpr, D_PER_TOKEN: tl.constexpr, HAS_QM: tl.constexpr,
    HAS_DM: tl.constexpr, IEEE: tl.constexpr, FLAT: tl.constexpr, QUERIES: tl.constexpr,
    TRANS: tl.constexpr, TILE_MAX: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """``TRANS``: the tile is computed as ``(document tokens, query rows)``, so the dot's M is the
    document tile (short queries then fill Hopper's 64-row warpgroup MMA) and a per-token document
    scale is one value per accumulator row. ``TILE_MAX``: the running best is the elementwise
    maximum of the tiles, reduced once per document (else each tile's row maxima)."""
    _fp8_program(
        Q, D, None, SQ, SD, QM, DM, OUT, nq, nd, lq, ld, dim, docs_per_prog, Q_PER_TOKEN,
        D_PER_TOKEN, HAS_QM, HAS_DM, IEEE, FLAT, QUERIES, False, TRANS, TILE_MAX, BLOCK_Q,
        BLOCK_D, BLOCK_K,
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
        D_PER_TOKEN, HAS_QM, HAS_DM, IEEE, FLAT, QUERIES, True, False, True, BLOCK_Q, BLOCK_D,
        BLOCK_K,
    )  # fmt: skip


@triton.jit
def _empty_best(
    ROWS: tl.constexpr, BLOCK_D: tl.constexpr, TRANS: tl.constexpr, TILE_MAX: tl.constexpr
):
    if not TILE_MAX:
        best = tl.full([ROWS], float("-inf"), tl.float32)
    elif TRANS:
        best = tl.full([BLOCK_D, ROWS], float("-inf"), tl.float32)
    else:
        best = tl.full([ROWS, BLOCK_D], float("-inf"), tl.float32)
    return best


@triton.jit
def _best_per_row(acc, TRANS: tl.constexpr, TILE_MAX: tl.constexpr):
    if TILE_MAX:
        best = _reduce_tokens(acc, TRANS)
    else:
        best = acc
    return best


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
