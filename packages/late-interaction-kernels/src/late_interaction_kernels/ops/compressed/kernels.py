"""Triton kernels of the compressed index: each program scores one ``(query, document)`` pair and
writes one float32, so a search never materialises decompressed tokens or a query-by-collection
score matrix.

* :func:`centroid_pair_kernel`: the candidate score. The document's centroid ids index the
  query's row block of ``centroids @ Q.T`` (``(K, Lq)``, contiguous per centroid: one 64-byte
  read per token for 32 fp16 query tokens), a running max per query token, then the sum.
* :func:`probed_lists_kernel`: the same score for every document on a query's probed inverted
  lists, written into a dense row per query (small batches: no candidate count on the host).
* :func:`pair_maxsim_kernel`: MaxSim against the document's tokens, either decompressed in
  registers from their centroid and packed bucket indices (``COMPRESSED``) or read as stored
  (the exact rerank), one ``tl.dot`` per tile of tokens against the query's tokens.

Under the interpreter a loop cannot run to a bound read from memory, so both kernels then run
every document to ``max_len`` with masks (``DYNAMIC_BOUNDS=False``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_pair(PAIR_Q, PAIR_D, DOC_OFF, p):
    """Pair ``p``: its query, its document's first token row and token count."""
    qi = tl.load(PAIR_Q + p).to(tl.int64)
    doc = tl.load(PAIR_D + p).to(tl.int64)
    lo = tl.load(DOC_OFF + doc)
    return qi, lo, (tl.load(DOC_OFF + doc + 1) - lo).to(tl.int32)


@triton.jit
def centroid_score(base, CODES, lo, n_tok, lq, max_len,
                   DYNAMIC_BOUNDS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_Q: tl.constexpr):  # fmt: skip
    """One document's candidate score from its query's ``(K, Lq)`` centroid scores at ``base``."""
    total = 0.0
    for q0 in range(0, lq, BLOCK_Q):
        t = q0 + tl.arange(0, BLOCK_Q)
        t_ok = t < lq
        best = tl.full((BLOCK_Q,), float("-inf"), tl.float32)
        stop = n_tok if DYNAMIC_BOUNDS else max_len
        for j0 in range(0, stop, BLOCK_L):
            j = j0 + tl.arange(0, BLOCK_L)
            j_ok = j < n_tok
            code = tl.load(CODES + lo + j, mask=j_ok, other=0).to(tl.int64)
            s = tl.load(base + code[:, None] * lq + t[None, :],
                        mask=j_ok[:, None] & t_ok[None, :], other=float("-inf"))  # fmt: skip
            best = tl.maximum(best, tl.max(s.to(tl.float32), 0))
        # an empty document (best -inf everywhere) and padded query columns add 0
        total += tl.sum(tl.where(t_ok & (best > float("-inf")), best, 0.0), 0)
    return total


@triton.jit
def centroid_pair_kernel(
    QCS, PAIR_Q, PAIR_D, CODES, DOC_OFF, OUT, n_centroids, lq, max_len,
    DYNAMIC_BOUNDS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_Q: tl.constexpr,
):  # fmt: skip
    p = tl.program_id(0)
    qi, lo, n_tok = load_pair(PAIR_Q, PAIR_D, DOC_OFF, p)
    base = QCS + qi * n_centroids * lq
    total = centroid_score(base, CODES, lo, n_tok, lq, max_len, DYNAMIC_BOUNDS, BLOCK_L, BLOCK_Q)
    tl.store(OUT + p, total)


@triton.jit
def probed_lists_kernel(
    QCS, PROBES, LIST_OFF, LIST_DOCS, CODES, DOC_OFF, OUT,
    n_probes, n_centroids, n_docs, lq, max_len, per_program,
    DYNAMIC_BOUNDS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_Q: tl.constexpr,
):  # fmt: skip
    """Program ``(i, p, c)``: documents ``c * per_program ...`` of the list of query ``i``'s
    probe ``p`` (negative: none), each scored and written to row ``i`` of the dense ``OUT``
    ``(Nq, N)`` at its id. A document on several probed lists is written with the same value by
    each, so the dense row needs no deduplication and the host never learns the count."""
    qi = tl.program_id(0).to(tl.int64)
    centroid = tl.load(PROBES + qi * n_probes + tl.program_id(1)).to(tl.int64)
    if centroid >= 0:
        start = tl.load(LIST_OFF + centroid)
        end = tl.load(LIST_OFF + centroid + 1)
        first = start + tl.program_id(2).to(tl.int64) * per_program
        base = QCS + qi * n_centroids * lq
        for i in range(0, per_program):
            e = first + i
            if e < end:
                doc = tl.load(LIST_DOCS + e).to(tl.int64)
                lo = tl.load(DOC_OFF + doc)
                n_tok = (tl.load(DOC_OFF + doc + 1) - lo).to(tl.int32)
                total = centroid_score(base, CODES, lo, n_tok, lq, max_len,
                                       DYNAMIC_BOUNDS, BLOCK_L, BLOCK_Q)  # fmt: skip
                tl.store(OUT + qi * n_docs + doc, total)


@triton.jit
def pair_maxsim_kernel(
    Q, PAIR_Q, PAIR_D, DOC_OFF, TOKENS, CODES, PACKED, C, W, OUT,
    lq, dim, width, max_len,
    COMPRESSED: tl.constexpr, NBITS: tl.constexpr, PER_BYTE: tl.constexpr, UPCAST: tl.constexpr,
    DYNAMIC_BOUNDS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    p = tl.program_id(0)
    qi, lo, n_tok = load_pair(PAIR_Q, PAIR_D, DOC_OFF, p)
    f = tl.arange(0, BLOCK_D)
    f_ok = f < dim
    total = 0.0
    for q0 in range(0, lq, BLOCK_Q):
        t = q0 + tl.arange(0, BLOCK_Q)
        t_ok = t < lq
        q = tl.load(Q + (qi * lq + t)[:, None] * dim + f[None, :],
                    mask=t_ok[:, None] & f_ok[None, :], other=0.0)  # fmt: skip
        if UPCAST:
            q = q.to(tl.float32)
        best = tl.full((BLOCK_Q,), float("-inf"), tl.float32)
        stop = n_tok if DYNAMIC_BOUNDS else max_len
        for j0 in range(0, stop, BLOCK_T):
            j = j0 + tl.arange(0, BLOCK_T)
            j_ok = j < n_tok
            rows = (lo + j).to(tl.int64)
            ok = j_ok[:, None] & f_ok[None, :]
            if COMPRESSED:
                code = tl.load(CODES + rows, mask=j_ok, other=0).to(tl.int64)
                x = tl.load(C + code[:, None] * dim + f[None, :], mask=ok, other=0.0).to(tl.float32)
                byte = tl.load(PACKED + rows[:, None] * width + (f // PER_BYTE)[None, :],
                               mask=ok, other=0).to(tl.int32)  # fmt: skip
                bucket = (byte >> ((f % PER_BYTE) * NBITS)[None, :]) & ((1 << NBITS) - 1)
                x += tl.load(W + f[None, :] * (1 << NBITS) + bucket, mask=ok, other=0.0)
            else:
                x = tl.load(TOKENS + rows[:, None] * dim + f[None, :], mask=ok, other=0.0)
                x = x.to(tl.float32)
            if not UPCAST:
                x = x.to(Q.dtype.element_ty)
            if IEEE:  # float32 queries are scored in float32, not tf32
                s = tl.dot(q, tl.trans(x), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(x))
            s = tl.where(j_ok[None, :], s, float("-inf"))
            best = tl.maximum(best, tl.max(s, 1))
        total += tl.sum(tl.where(t_ok & (best > float("-inf")), best, 0.0), 0)
    tl.store(OUT + p, total)
