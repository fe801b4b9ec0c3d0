"""Triton forward kernel of MaxSim: one program per (pair, query chunk).

A program loads a block of query tokens once, streams the document's tokens in ``BLOCK_D`` tiles
through ``tl.dot`` with fp32 accumulation, and keeps a running max (and, only when gradients are
needed, the running argmax) per query token. Queries longer than :data:`LONG_QUERY_THRESHOLD`
tokens are split into fixed :data:`QUERY_CHUNK`-token chunks scored by separate programs and summed
afterwards (exact, deterministic), so long queries fill the GPU and tune under one cache key.

On Hopper, queries of more than 128 tokens take :func:`maxsim_fwd_tma_kernel`: the same program
with its tiles loaded through TMA tensor descriptors and a tile-wide running max (one ``max`` per
similarity, reduced once per document). At those compute-bound shapes the per-element address
arithmetic of pointer loads and the per-tile row reductions, not the tensor cores, set the pace.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_dispatch import (
    autotune,
    config_space,
    interpreter_enabled,
    padded_dim,
    shape_bucket,
    tile_shared_memory,
)
from triton_dispatch.autotune import prune_by_shared_memory
from triton_dispatch.launch import KernelLaunch, PlanCache

from ..common import tma
from ..common.buffers import output_buffer
from ..common.document_max import best_over_document
from ..common.layout import ALL_PAIRS, GROUPED, VARLEN, VARLEN_ALL_PAIRS, num_pairs
from ..common.precision import NORM_EPS, dot_settings
from ..common.tuning import tuning_bench

#: Queries longer than this are scored in chunks of :data:`QUERY_CHUNK` tokens.
LONG_QUERY_THRESHOLD = 512
QUERY_CHUNK = 128


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
    return not (kw["BLOCK_Q"] >= 64 and stages == 2)


_FWD_CONFIGS = config_space(
    {"BLOCK_Q": [16, 32, 64, 128], "BLOCK_D": [32, 64, 128, 256], "TILE_MAX": [False, True]},
    num_warps=[4, 8],
    num_stages=[2, 3, 4],
    where=_forward_config_ok,
)
_FWD_DEFAULT = triton.Config(
    {"BLOCK_Q": 32, "BLOCK_D": 64, "TILE_MAX": True}, num_warps=4, num_stages=3
)
_FWD_INTERPRET = triton.Config(
    {"BLOCK_Q": 16, "BLOCK_D": 16, "TILE_MAX": True}, num_warps=4, num_stages=1
)


@triton.jit
def _forward_program(
    Q, D, QDESC, DDESC, QM, DM, CUQ, CUD, PARTIAL, ARGMAX, d_bound, n_doc, lq, ld, chunk_len,
    n_chunks, dim,
    LAYOUT: tl.constexpr, HAS_QM: tl.constexpr, HAS_DM: tl.constexpr,
    SAVE_ARGMAX: tl.constexpr, UPCAST: tl.constexpr, NORMALIZE: tl.constexpr,
    NORM_EPS: tl.constexpr, IEEE: tl.constexpr, DYNAMIC_BOUNDS: tl.constexpr,
    TMA: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr, TILE_MAX: tl.constexpr,
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
    for t0 in range(0, t_stop, BLOCK_Q):
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
            TILE_MAX, BLOCK_Q, BLOCK_D,
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
@triton.jit(
    do_not_specialize=["d_bound", "n_doc", "lq", "ld", "chunk_len", "n_chunks", "LQ_BUCKET"]
)
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
    LQ_BUCKET,
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
):
    _forward_program(
        Q, D, None, None, QM, DM, CUQ, CUD, PARTIAL, ARGMAX, d_bound, n_doc, lq, ld, chunk_len,
        n_chunks, dim, LAYOUT, HAS_QM, HAS_DM, SAVE_ARGMAX, UPCAST, NORMALIZE, NORM_EPS, IEEE,
        DYNAMIC_BOUNDS, False, EVEN_K, BLOCK_K, BLOCK_Q, BLOCK_D, TILE_MAX,
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


#: All-pairs calls with queries up to this many tokens and at least MIN_GROUP_QUERIES queries run
#: the query-group kernel (several queries per document tile).
MAX_GROUP_QUERY_LEN = 64
MIN_GROUP_QUERIES = 4


def chunking(lq: int) -> tuple[int, int]:
    """``(chunk_len, n_chunks)`` of a query length (one chunk up to the threshold)."""
    if lq > LONG_QUERY_THRESHOLD:
        return QUERY_CHUNK, triton.cdiv(lq, QUERY_CHUNK)
    return max(lq, 1), 1


#: Queries (or their chunks) of at least this many tokens take the TMA kernel on Hopper. From an
#: H100 sweep: 128-token chunks of long queries ran 1.27–1.31x faster through it; one 128-token
#: query against 1000 documents of 1024 tokens (memory-bound) ran the same either way.
TMA_MIN_QUERY_LEN = 129
#: The TMA kernel's one config: the best at every long shape of that sweep (128×64 tiles with a
#: tile-wide running max; 64-row tiles, 128-column tiles, 4–5 stages and a persistent grid were
#: all slower), so it is not autotuned.
_TMA_BLOCKS = dict(BLOCK_Q=128, BLOCK_D=64)
_TMA_OPTIONS = dict(num_warps=8, num_stages=3)
_TMA_INTERPRET_BLOCKS = dict(BLOCK_Q=16, BLOCK_D=16)


def _tma_eligible(lq, dim, dtype, device, rows_q, rows_d) -> bool:
    return (
        lq >= TMA_MIN_QUERY_LEN
        and dtype in (torch.bfloat16, torch.float16)
        and tma.rows_fit(dim, 2, max(rows_q, rows_d))
        and tma.tma_supported(device)
    )


class ForwardPlan:
    """Everything a forward launch needs that depends only on metadata: chunking, kernel, grid,
    constexprs and output shapes. Built once per key (:data:`FORWARD_PLANS`); a call allocates the
    outputs and launches."""

    def __init__(
        self, layout, n_query, n_doc, lq, ld, dim, dtype, device, has_qm, has_dm, save_argmax,
        normalize, rows_q, rows_d,
    ):  # fmt: skip
        self.n_pairs = n_pairs = num_pairs(layout, n_query, n_doc)
        self.dim, self.ld = dim, ld
        self.lq = lq
        self.device = device
        self.save_argmax = save_argmax
        self.varlen = layout in (VARLEN, VARLEN_ALL_PAIRS)
        chunk_len, self.n_chunks = chunking(lq)
        upcast, ieee = dot_settings(dtype)
        flags = dict(
            HAS_QM=has_qm, HAS_DM=has_dm, SAVE_ARGMAX=save_argmax, UPCAST=upcast,
            NORMALIZE=normalize, NORM_EPS=NORM_EPS, IEEE=ieee, EVEN_K=dim == padded_dim(dim),
            BLOCK_K=padded_dim(dim),
        )  # fmt: skip
        self.no_argmax = torch.empty((0,), dtype=torch.int32, device=device)
        if layout == ALL_PAIRS and n_query >= MIN_GROUP_QUERIES and lq <= MAX_GROUP_QUERY_LEN:
            group = padded_dim(lq)
            self.n_chunks = 1
            self.launch = KernelLaunch(
                maxsim_fwd_query_group_kernel,
                lambda meta: (n_doc * triton.cdiv(n_query, meta["BLOCK_Q"] // group),),
                dict(n_query=n_query, n_doc=n_doc, lq=lq, ld=ld, dim=dim, QGROUP=group, **flags),
                device=device,
            )
            self.per_call = ("Q", "D", "QM", "DM", "PARTIAL", "ARGMAX")
        else:
            self.launch = KernelLaunch(
                maxsim_fwd_kernel,
                (n_pairs * self.n_chunks,),
                dict(
                    n_doc=max(n_doc, 1),
                    lq=lq,
                    ld=ld,
                    chunk_len=chunk_len,
                    n_chunks=self.n_chunks,
                    dim=dim,
                    LQ_BUCKET=shape_bucket(chunk_len, minimum=16, maximum=512),
                    LAYOUT=layout,
                    DYNAMIC_BOUNDS=not interpreter_enabled(),
                    **flags,
                ),
                device=device,
            )
            self.per_call = ("Q", "D", "QM", "DM", "CUQ", "CUD", "PARTIAL", "ARGMAX", "d_bound")
        assert tuple(self.launch.free) == self.per_call, self.launch.free
        self.tma = None
        if len(self.per_call) == 9 and _tma_eligible(lq, dim, dtype, device, rows_q, rows_d):
            bound = {k: v for k, v in self.launch.bound.items() if k != "LQ_BUCKET"}
            blocks = _TMA_INTERPRET_BLOCKS if interpreter_enabled() else _TMA_BLOCKS
            self.tma = KernelLaunch(
                maxsim_fwd_tma_kernel, (n_pairs * self.n_chunks,), dict(bound, **blocks),
                device=device, options=_TMA_OPTIONS,
            )  # fmt: skip
            self.q_box = [blocks["BLOCK_Q"], flags["BLOCK_K"]]
            self.d_box = [blocks["BLOCK_D"], flags["BLOCK_K"]]

    def __call__(self, Q2, D2, q_mask, d_mask, cu_q, cu_d) -> tuple[torch.Tensor, torch.Tensor]:
        n_pairs, lq = self.n_pairs, self.lq
        partial = output_buffer((n_pairs, self.n_chunks), dtype=torch.float32, device=self.device)
        if not self.save_argmax:
            argmax = self.no_argmax
        elif self.varlen:  # slots past a query's own length are never written
            argmax = torch.full((n_pairs, lq), -1, dtype=torch.int32, device=self.device)
        else:
            argmax = output_buffer((n_pairs, lq), dtype=torch.int32, device=self.device)
        if n_pairs == 0:
            return partial.sum(1), argmax
        qm = q_mask.view(torch.uint8) if q_mask is not None else partial
        dm = d_mask.view(torch.uint8) if d_mask is not None else partial
        if len(self.per_call) == 6:
            self.launch(Q2, D2, qm, dm, partial, argmax)
            return partial.view(n_pairs), argmax
        if self.varlen:
            # only the interpreter's static loops read it; they need the longest document
            d_bound = int((cu_d[1:] - cu_d[:-1]).max()) if interpreter_enabled() else 0
        else:
            d_bound = self.ld
        cu_q = cu_q if cu_q is not None else partial
        cu_d = cu_d if cu_d is not None else partial
        if self.tma is not None and tma.aligned(Q2) and tma.aligned(D2):
            q_desc = tma.rows_descriptor(Q2, self.dim, self.q_box)
            d_desc = tma.rows_descriptor(D2, self.dim, self.d_box)
            self.tma(Q2, D2, q_desc, d_desc, qm, dm, cu_q, cu_d, partial, argmax, d_bound)
        else:
            self.launch(Q2, D2, qm, dm, cu_q, cu_d, partial, argmax, d_bound)
        scores = partial.view(n_pairs) if self.n_chunks == 1 else partial.sum(1)
        return scores, argmax


#: Forward plans by metadata (the placeholders for absent masks are never read).
FORWARD_PLANS: PlanCache[ForwardPlan] = PlanCache("late_interaction_kernels.maxsim_forward")


def maxsim_forward_triton(
    Q2: torch.Tensor,
    D2: torch.Tensor,
    q_mask: torch.Tensor | None,
    d_mask: torch.Tensor | None,
    cu_q: torch.Tensor | None,
    cu_d: torch.Tensor | None,
    layout: int,
    n_query: int,
    n_doc: int,
    lq: int,
    ld: int,
    save_argmax: bool,
    normalize: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores ``(pairs,)`` fp32 and, when ``save_argmax``, argmax rows ``(pairs, lq)`` int32
    (an empty int32 tensor otherwise). Inputs contiguous."""
    meta = (
        layout, n_query, n_doc, lq, ld, Q2.shape[-1], Q2.dtype, Q2.device, q_mask is not None,
        d_mask is not None, save_argmax, normalize, Q2.numel() // max(Q2.shape[-1], 1),
        D2.numel() // max(D2.shape[-1], 1),
    )  # fmt: skip
    plan = FORWARD_PLANS.get(meta, lambda: ForwardPlan(*meta))
    return plan(Q2, D2, q_mask, d_mask, cu_q, cu_d)


__all__ = [
    "ALL_PAIRS",
    "FORWARD_PLANS",
    "GROUPED",
    "LONG_QUERY_THRESHOLD",
    "QUERY_CHUNK",
    "ForwardPlan",
    "chunking",
    "maxsim_forward_triton",
]
