"""Triton forward kernel of MaxSim: one program per (pair, query chunk).

A program loads a block of query tokens once, streams the document's tokens in ``BLOCK_D`` tiles
through ``tl.dot`` with fp32 accumulation, and keeps a running max (and, only when gradients are
needed, the running argmax) per query token. Queries longer than
:data:`.plan.LONG_QUERY_THRESHOLD` tokens are split into fixed :data:`.plan.QUERY_CHUNK`-token
chunks scored by separate programs and summed
afterwards (exact, deterministic), so long queries fill the GPU and tune under one cache key.

On Hopper, queries of more than 128 tokens take :func:`maxsim_fwd_tma_kernel`: the same program
with its tiles loaded through TMA tensor descriptors and a tile-wide running max (one ``max`` per
similarity, reduced once per document). At those compute-bound shapes the per-element address
arithmetic of pointer loads and the per-tile row reductions, not the tensor cores, set the pace.
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_dispatch import (
    autotune,
    config_space,
    tile_shared_memory,
)
from triton_dispatch.autotune import prune_by_shared_memory

from ..common.document_max import best_over_document
from ..common.tuning import tuning_bench


def _fwd_smem(kw, num_stages, args) -> int:
    elem = args["Q"].element_size()
    return tile_shared_memory(
        (kw["BLOCK_Q"], args["BLOCK_K"]),
        (args["BLOCK_K"], kw["BLOCK_D"]),
        element_size=elem,
        num_stages=num_stages,
    )


def prune_query_blocks(configs, named_args, **kwargs):
    """A query of up to 128 tokens is one block of its padded length (a 32-token query gains
    nothing from a 128-row block and loses from a 16-row one: the document would be read twice);
    128-token chunks of long queries try 64- and 128-row blocks."""
    lq = {**named_args, **kwargs}["LQ_BUCKET"]
    hi = min(max(lq, 16), 128)
    lo = hi if hi < 128 else 64
    return [c for c in configs if lo <= c.kwargs["BLOCK_Q"] <= hi] or configs


def _prune_fwd(configs, named_args, **kwargs):
    return prune_by_shared_memory(_fwd_smem, device_arg="Q")(
        prune_query_blocks(configs, named_args, **kwargs), named_args, **kwargs
    )


def _forward_config_ok(kw, warps, stages) -> bool:
    # from an H100 sweep: 8 warps only pay on large tiles, 4 warps cannot hold a 128×128 one, and
    # 64/128-row blocks (compute-bound long queries) want deep pipelines
    tile = kw["BLOCK_Q"] * kw["BLOCK_D"]
    if (tile >= 128 * 128 and warps < 8) or (tile <= 32 * 64 and warps == 8):
        return False
    if kw["BLOCK_D"] == 256 and kw["BLOCK_Q"] < 64:  # wide tiles only for the compute-bound rows
        return False
    if kw["TILE_MAX"] and tile > 128 * 128:  # two fp32 tiles per thread would spill
        return False
    # one masked loop over a document pays where reading it is the work (short queries); a
    # long query's unmasked full tiles save more (H200: 1.0x-0.93x at 128 tokens)
    if kw["ONE_LOOP"] and (kw["BLOCK_Q"] > 32 or kw["BLOCK_D"] > 128):
        return False
    return not (kw["BLOCK_Q"] >= 64 and stages == 2)


_FWD_CONFIGS = config_space(
    {"BLOCK_Q": [16, 32, 64, 128], "BLOCK_D": [32, 64, 128, 256], "TILE_MAX": [False, True],
     "ONE_LOOP": [False, True]},
    num_warps=[4, 8],
    num_stages=[2, 3, 4],
    where=_forward_config_ok,
)  # fmt: skip
# the read-bound regime's pick on an H200 and an H100: one query of 32 tokens against 10,000
# documents of 300 at 96 % of the H200's copy rate (two loops: 0.210 ms, one: 0.188 ms)
_FWD_DEFAULT = triton.Config(
    {"BLOCK_Q": 32, "BLOCK_D": 64, "TILE_MAX": False, "ONE_LOOP": True}, num_warps=4,
    num_stages=3,
)  # fmt: skip
_FWD_INTERPRET = triton.Config(
    {"BLOCK_Q": 16, "BLOCK_D": 16, "TILE_MAX": True, "ONE_LOOP": False}, num_warps=4,
    num_stages=1,
)  # fmt: skip


@triton.jit
def _forward_program(
    Q, D, QDESC, DDESC, QM, DM, CUQ, CUD, PARTIAL, ARGMAX, d_bound, n_doc, lq, ld, chunk_len,
    n_chunks, dim,
    LAYOUT: tl.constexpr, HAS_QM: tl.constexpr, HAS_DM: tl.constexpr,
    SAVE_ARGMAX: tl.constexpr, UPCAST: tl.constexpr, NORMALIZE: tl.constexpr,
    NORM_EPS: tl.constexpr, IEEE: tl.constexpr, DYNAMIC_BOUNDS: tl.constexpr,
    TMA: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr, TILE_MAX: tl.constexpr, ONE_LOOP: tl.constexpr = False,
    ONE_Q_BLOCK: tl.constexpr = False,
):  # fmt: skip
    # chunks of one pair are neighbours in launch order, so they run together and read the
    # document from L2 (pair-major order re-read a long query's documents once per chunk)
    pid = tl.program_id(0)
    pair = pid // n_chunks
    chunk = pid % n_chunks
    if LAYOUT == 0:  # ALL_PAIRS
        qi = pair // n_doc
        doc = pair % n_doc
    elif LAYOUT == 1:  # GROUPED
        qi = pair // n_doc
        doc = pair
    elif LAYOUT == 4:  # VARLEN_ALL_PAIRS
        qi = pair // n_doc
        doc = pair % n_doc
    else:  # PAIRS, VARLEN
        qi = pair
        doc = pair
    if LAYOUT >= 3:
        q_start = tl.load(CUQ + qi).to(tl.int64)
        q_len = (tl.load(CUQ + qi + 1) - q_start).to(tl.int32)
        d_start = tl.load(CUD + doc).to(tl.int64)
        d_len = (tl.load(CUD + doc + 1) - d_start).to(tl.int32)
    else:
        q_start = qi.to(tl.int64) * lq
        q_len = lq
        d_start = doc.to(tl.int64) * ld
        d_len = ld

    k = tl.arange(0, BLOCK_K)
    k_ok = k < dim
    t_begin = chunk * chunk_len
    t_end = tl.minimum(t_begin + chunk_len, q_len)
    # Loop bounds: the pair's own lengths on the GPU; static bounds with masking under the
    # interpreter, which cannot iterate over a range whose bounds come from program_id or loads.
    if DYNAMIC_BOUNDS:
        t_stop = t_end - t_begin
        d_stop = d_len
    else:
        t_stop = chunk_len
        d_stop = d_bound
    total = tl.zeros((BLOCK_Q,), dtype=tl.float32)
    # ONE_Q_BLOCK (the chunk fits one block): constant bounds, so the loop folds away. A runtime
    # loop around the pipelined document walk, even one of a single trip, held twice the
    # registers (158 against 80 in the read-bound config): fewer programs per SM, fewer loads in
    # flight.
    t_limit = BLOCK_Q if ONE_Q_BLOCK else t_stop
    for t0 in range(0, t_limit, BLOCK_Q):
        rows = t_begin + t0 + tl.arange(0, BLOCK_Q)
        row_ok = rows < t_end
        # EVEN_K (d a power of two): no mask along the contiguous axis, so loads stay vectorised
        if EVEN_K:
            q_ok = row_ok[:, None]
        else:
            q_ok = row_ok[:, None] & k_ok[None, :]
        if TMA:  # rows past the query are another query's or zeros; `keep` drops them
            q = QDESC.load([(q_start + t_begin + t0).to(tl.int32), 0])
        else:
            q = tl.load(Q + (q_start + rows)[:, None] * dim + k[None, :], mask=q_ok, other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        if NORMALIZE:
            q32 = q.to(tl.float32)
            q_scale = 1.0 / tl.maximum(tl.sqrt(tl.sum(q32 * q32, 1)), NORM_EPS)
        else:
            q_scale = tl.zeros((BLOCK_Q,), dtype=tl.float32)  # unused
        best, best_idx = best_over_document(
            q, q_scale, D, DDESC, DM, doc, d_start, d_len, d_stop, ld, dim, k, k_ok,
            TMA, HAS_DM, SAVE_ARGMAX, UPCAST, NORMALIZE, NORM_EPS, IEEE, EVEN_K, DYNAMIC_BOUNDS,
            TILE_MAX, BLOCK_Q, BLOCK_D, ONE_LOOP,
        )  # fmt: skip
        keep = row_ok & (best != float("-inf"))
        if HAS_QM:
            keep = keep & (tl.load(QM + qi.to(tl.int64) * lq + rows, mask=row_ok, other=0) != 0)
        total += tl.where(keep, best, 0.0)
        if SAVE_ARGMAX:
            winner = tl.where(keep, (d_start + best_idx).to(tl.int32), -1)
            tl.store(ARGMAX + pair.to(tl.int64) * lq + rows, winner, mask=row_ok)
    tl.store(PARTIAL + pair.to(tl.int64) * n_chunks + chunk, tl.sum(total, 0))


@autotune(
    _FWD_CONFIGS,
    key=["LQ_BUCKET", "BLOCK_K", "LAYOUT", "SAVE_ARGMAX", "HAS_QM", "HAS_DM", "NORMALIZE"],
    default=_FWD_DEFAULT,
    prune=_prune_fwd,
    interpret_config=_FWD_INTERPRET,
    do_bench=tuning_bench,
)
# Sizes that change from batch to batch are not specialised on: each new ``% 16`` or ``== 1`` class of
# them compiled the kernel and its C launcher again (about a second per new shape on an H100), and
# rows are addressed through ``dim``, whose divisibility stays specialised.
@triton.jit(do_not_specialize=["d_bound", "n_doc", "lq", "ld", "chunk_len", "n_chunks"])
def maxsim_fwd_kernel(
    Q,
    D,
    QM,
    DM,
    CUQ,
    CUD,
    PARTIAL,
    ARGMAX,
    d_bound,
    n_doc,
    lq,
    ld,
    chunk_len,
    n_chunks,
    dim,
    LQ_BUCKET: tl.constexpr,  # the regime's key, and ≥ chunk_len: a block this tall holds a chunk
    LAYOUT: tl.constexpr,
    HAS_QM: tl.constexpr,
    HAS_DM: tl.constexpr,
    SAVE_ARGMAX: tl.constexpr,
    UPCAST: tl.constexpr,
    NORMALIZE: tl.constexpr,
    NORM_EPS: tl.constexpr,
    IEEE: tl.constexpr,
    DYNAMIC_BOUNDS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TILE_MAX: tl.constexpr,
    ONE_LOOP: tl.constexpr = False,  # table rows from before it was tuned take the two loops
):
    _forward_program(
        Q, D, None, None, QM, DM, CUQ, CUD, PARTIAL, ARGMAX, d_bound, n_doc, lq, ld, chunk_len,
        n_chunks, dim, LAYOUT, HAS_QM, HAS_DM, SAVE_ARGMAX, UPCAST, NORMALIZE, NORM_EPS, IEEE,
        DYNAMIC_BOUNDS, False, EVEN_K, BLOCK_K, BLOCK_Q, BLOCK_D, TILE_MAX, ONE_LOOP,
        BLOCK_Q >= LQ_BUCKET,
    )  # fmt: skip


@triton.jit(do_not_specialize=["d_bound", "n_doc", "lq", "ld", "chunk_len", "n_chunks"])
def maxsim_fwd_tma_kernel(
    Q, D, QDESC, DDESC, QM, DM, CUQ, CUD, PARTIAL, ARGMAX, d_bound, n_doc, lq, ld, chunk_len,
    n_chunks, dim,
    LAYOUT: tl.constexpr, HAS_QM: tl.constexpr, HAS_DM: tl.constexpr,
    SAVE_ARGMAX: tl.constexpr, UPCAST: tl.constexpr, NORMALIZE: tl.constexpr,
    NORM_EPS: tl.constexpr, IEEE: tl.constexpr, DYNAMIC_BOUNDS: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """The Hopper path of :func:`maxsim_fwd_kernel`: query and document tiles arrive through TMA
    tensor descriptors (no per-element address arithmetic, which on the compute-bound shapes cost
    as much issue time as the row maxima) and the running max is elementwise over the tile."""
    _forward_program(
        Q, D, QDESC, DDESC, QM, DM, CUQ, CUD, PARTIAL, ARGMAX, d_bound, n_doc, lq, ld, chunk_len,
        n_chunks, dim, LAYOUT, HAS_QM, HAS_DM, SAVE_ARGMAX, UPCAST, NORMALIZE, NORM_EPS, IEEE,
        DYNAMIC_BOUNDS, True, EVEN_K, BLOCK_K, BLOCK_Q, BLOCK_D, True,
    )  # fmt: skip


def _prune_group(configs, named_args, **kwargs):
    # a block holds whole (padded) queries
    group = {**named_args, **kwargs}["QGROUP"]
    kept = [c for c in configs if c.kwargs["BLOCK_Q"] >= group]
    return prune_by_shared_memory(_fwd_smem, device_arg="Q")(kept, named_args, **kwargs)


_GROUP_CONFIGS = config_space(
    {"BLOCK_Q": [64, 128], "BLOCK_D": [64], "TILE_MAX": [False, True]},
    num_warps=[4, 8],
    num_stages=[2, 3],
)
_GROUP_DEFAULT = triton.Config(
    {"BLOCK_Q": 64, "BLOCK_D": 64, "TILE_MAX": True}, num_warps=4, num_stages=3
)
_GROUP_INTERPRET = triton.Config(
    {"BLOCK_Q": 64, "BLOCK_D": 16, "TILE_MAX": True}, num_warps=4, num_stages=1
)


@autotune(
    _GROUP_CONFIGS,
    key=["QGROUP", "BLOCK_K", "SAVE_ARGMAX", "HAS_QM", "HAS_DM", "NORMALIZE"],
    default=_GROUP_DEFAULT,
    prune=_prune_group,
    interpret_config=_GROUP_INTERPRET,
    do_bench=tuning_bench,
)
@triton.jit(do_not_specialize=["n_query", "n_doc", "lq", "ld"])
def maxsim_fwd_query_group_kernel(
    Q,
    D,
    QM,
    DM,
    PARTIAL,
    ARGMAX,
    n_query,
    n_doc,
    lq,
    ld,
    dim,
    QGROUP: tl.constexpr,
    HAS_QM: tl.constexpr,
    HAS_DM: tl.constexpr,
    SAVE_ARGMAX: tl.constexpr,
    UPCAST: tl.constexpr,
    NORMALIZE: tl.constexpr,
    NORM_EPS: tl.constexpr,
    IEEE: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TILE_MAX: tl.constexpr,
):
    """All-pairs scores of short queries: one program scores ``BLOCK_Q // QGROUP`` whole queries
    (each padded to ``QGROUP`` rows) against one document, so every document tile it loads feeds a
    full-height ``tl.dot`` and is read once per group of queries instead of once per query."""
    G: tl.constexpr = BLOCK_Q // QGROUP
    pid = tl.program_id(0)
    n_groups = tl.cdiv(n_query, G)
    # consecutive programs share a document: its tiles are read from L2 by all of them
    doc = pid // n_groups
    first = (pid % n_groups) * G
    i = tl.arange(0, BLOCK_Q)
    qi = first + i // QGROUP
    t = i % QGROUP
    row_ok = (t < lq) & (qi < n_query)
    q_row = qi.to(tl.int64) * lq + t
    k = tl.arange(0, BLOCK_K)
    k_ok = k < dim
    if EVEN_K:
        q_ok = row_ok[:, None]
    else:
        q_ok = row_ok[:, None] & k_ok[None, :]
    q = tl.load(Q + q_row[:, None] * dim + k[None, :], mask=q_ok, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    if NORMALIZE:
        q32 = q.to(tl.float32)
        q_scale = 1.0 / tl.maximum(tl.sqrt(tl.sum(q32 * q32, 1)), NORM_EPS)
    else:
        q_scale = tl.zeros((BLOCK_Q,), dtype=tl.float32)  # unused
    d_start = doc.to(tl.int64) * ld
    best, best_idx = best_over_document(
        q, q_scale, D, None, DM, doc, d_start, ld, ld, ld, dim, k, k_ok,
        False, HAS_DM, SAVE_ARGMAX, UPCAST, NORMALIZE, NORM_EPS, IEEE, EVEN_K, True, TILE_MAX, BLOCK_Q,
        BLOCK_D,
    )  # fmt: skip
    keep = row_ok & (best != float("-inf"))
    if HAS_QM:
        keep = keep & (tl.load(QM + q_row, mask=row_ok, other=0) != 0)
    scores = tl.sum(tl.reshape(tl.where(keep, best, 0.0), (G, QGROUP)), 1)
    queries = first + tl.arange(0, G)
    tl.store(PARTIAL + queries.to(tl.int64) * n_doc + doc, scores, mask=queries < n_query)
    if SAVE_ARGMAX:
        winner = tl.where(keep, (d_start + best_idx).to(tl.int32), -1)
        tl.store(ARGMAX + (qi.to(tl.int64) * n_doc + doc) * lq + t, winner, mask=row_ok)


__all__ = [
    "maxsim_fwd_kernel",
    "maxsim_fwd_query_group_kernel",
    "maxsim_fwd_tma_kernel",
]
