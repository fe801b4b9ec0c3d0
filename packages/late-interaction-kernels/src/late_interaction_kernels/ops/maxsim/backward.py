"""Triton backward kernels of MaxSim, driven by the argmax rows saved by the forward pass.

``grad_Q`` is always *gathered*: one program owns a block of query tokens and sums, over the
documents paired with its query, ``grad_score · D[argmax]`` in fp32 registers (no atomics).

``grad_D`` has two methods:

* ``unified`` — one program per (pair, query block) adds ``grad_score · Q`` into an fp32 copy of
  ``grad_D`` with atomics: fastest when few query tokens collide on one document token, needs a
  full-size fp32 buffer (for bf16/fp16 inputs) and is not bitwise reproducible.
* ``lowmem`` — destination-owned: one program owns a block of document rows, sums their
  contributors in fp32 registers in a fixed order, and writes ``grad_D`` once in the input dtype.
  No atomics, no fp32 buffer, bitwise reproducible. Two kernels:

  - *dense* (:func:`maxsim_grad_d_dense_kernel`), when each document is scored by a few queries
    (the 4-D layout, pairs, a rerank): the contributors of a row block are the argmax slots of its
    few pairs, so the kernel matches them against its rows directly (a one-hot ``tl.dot`` of the
    hits with the query tokens) and writes every row, zeros included: one pass over ``grad_D``,
    no sort;
  - *CSR* (:func:`maxsim_grad_d_owner_kernel`), for many queries per document (in-batch): the
    argmax rows are first inverted into a sorted list of the query tokens that point at each row.
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_dispatch import autotune, config_space

from ..common.tuning import tuning_bench

_DEFAULT_Q = triton.Config({"BLOCK_Q": 32}, num_warps=4, num_stages=1)
_DEFAULT_R = triton.Config({"BLOCK_R": 32}, num_warps=4, num_stages=1)
_GQ_CONFIGS = config_space({"BLOCK_Q": [16, 32, 64]}, num_warps=[4, 8], num_stages=[1])
_GD_CONFIGS = config_space({"BLOCK_Q": [16, 32, 64]}, num_warps=[4, 8], num_stages=[1])
_LOWMEM_CONFIGS = config_space({"BLOCK_R": [16, 32, 64]}, num_warps=[4, 8], num_stages=[1])
_DEFAULT_DENSE = triton.Config({"BLOCK_R": 64}, num_warps=4, num_stages=1)
_DENSE_CONFIGS = config_space({"BLOCK_R": [32, 64, 128]}, num_warps=[4, 8], num_stages=[1, 2])
#: Rows per program of the in-place normalize backward. Not autotuned: autotune trials would run
#: the in-place update many times on the same buffer (a memory-bound pass; one size is as good).
NORMALIZE_BLOCK_R = 16
_INTERPRET_Q = triton.Config({"BLOCK_Q": 16}, num_warps=4, num_stages=1)
_INTERPRET_R = triton.Config({"BLOCK_R": 16}, num_warps=4, num_stages=1)
_INTERPRET_DENSE = triton.Config({"BLOCK_R": 16}, num_warps=4, num_stages=1)


@triton.jit
def _inv_norm(x):
    return 1.0 / tl.maximum(tl.sqrt(tl.sum(x * x, 1)), 1e-12)


@triton.jit
def _grad_through_normalize(g, x):
    """``r·(g − (g·x̂)·x̂)`` per row, with ``r = 1/max(‖x‖, eps)`` and ``x̂ = r·x``: the gradient
    through ``F.normalize`` from the gradient ``g`` w.r.t. the normalised rows (fp32 tiles)."""
    norm = tl.sqrt(tl.sum(x * x, 1))
    inv = 1.0 / tl.maximum(norm, 1e-12)
    x_hat = x * inv[:, None]
    # below eps F.normalize divides by the constant eps: no projection term
    proj = tl.where(norm > 1e-12, tl.sum(g * x_hat, 1), 0.0)
    return inv[:, None] * (g - proj[:, None] * x_hat)


@triton.jit(do_not_specialize=["n_rows"])
def normalize_backward_kernel(G, X, OUT, n_rows, dim, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    """``OUT = r·(G − (G·x̂)·x̂)`` per row, with ``r = 1/max(‖x‖, eps)`` and ``x̂ = r·x``: the
    gradient through ``F.normalize`` from the gradient ``G`` w.r.t. the normalised row. ``OUT`` may
    alias ``G``."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    k = tl.arange(0, BLOCK_K)
    ok = (r < n_rows)[:, None] & (k < dim)[None, :]
    offs = r[:, None] * dim + k[None, :]
    x = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32)
    g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + offs, _grad_through_normalize(g, x).to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _query_start(LAYOUT: tl.constexpr, CUQ, pair, n_doc, lq):
    # first Q2 row of each pair's query (one return: the branches are resolved at compile time)
    if LAYOUT == 3:
        start = tl.load(CUQ + pair).to(tl.int64)
    elif LAYOUT == 4:
        start = tl.load(CUQ + pair // n_doc).to(tl.int64)
    elif LAYOUT <= 1:
        start = (pair // n_doc).to(tl.int64) * lq
    else:
        start = pair.to(tl.int64) * lq
    return start


@autotune(
    _GQ_CONFIGS,
    key=["LQ_BUCKET", "BLOCK_K", "LAYOUT", "NORMALIZE"],
    default=_DEFAULT_Q,
    interpret_config=_INTERPRET_Q,
    do_bench=tuning_bench,
)
# Batch sizes are not specialised on (see maxsim_fwd_kernel): a new shape must not recompile.
@triton.jit(do_not_specialize=["n_doc", "docs_per_split", "q_rows", "lq", "LQ_BUCKET"])
def maxsim_grad_q_kernel(
    G,
    D,
    ARGMAX,
    CUQ,
    GQ,
    n_doc,
    docs_per_split,
    q_rows,
    lq,
    dim,
    LQ_BUCKET,
    LAYOUT: tl.constexpr,
    NORMALIZE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_Q: tl.constexpr,
):
    qi = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    split = tl.program_id(2)
    k = tl.arange(0, BLOCK_K)
    k_ok = k < dim
    if LAYOUT >= 3:
        q_start = tl.load(CUQ + qi).to(tl.int64)
        q_len = (tl.load(CUQ + qi + 1) - q_start).to(tl.int32)
    else:
        q_start = qi.to(tl.int64) * lq
        q_len = lq
    row_ok = rows < q_len
    acc = tl.zeros((BLOCK_Q, BLOCK_K), dtype=tl.float32)
    # this program's share of the query's documents (all of them when there is one split)
    for jj in range(0, docs_per_split):
        j = split * docs_per_split + jj
        pair = qi.to(tl.int64) * n_doc + j
        j_ok = j < n_doc
        g = tl.load(G + pair, mask=j_ok, other=0.0)
        a = tl.load(ARGMAX + pair * lq + rows, mask=row_ok & j_ok, other=-1)
        ok = a >= 0
        x = tl.load(
            D + a.to(tl.int64)[:, None] * dim + k[None, :],
            mask=ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        x = x.to(tl.float32)
        if NORMALIZE:
            x = x * _inv_norm(x)[:, None]
        acc += tl.where(ok[:, None], g * x, 0.0)
    GQ += split.to(tl.int64) * q_rows * dim
    tl.store(
        GQ + (q_start + rows)[:, None] * dim + k[None, :],
        acc.to(GQ.dtype.element_ty),
        mask=row_ok[:, None] & k_ok[None, :],
    )


@autotune(
    _GD_CONFIGS,
    key=["LQ_BUCKET", "BLOCK_K", "LAYOUT"],
    default=_DEFAULT_Q,
    reset_to_zero=["GD"],
    interpret_config=_INTERPRET_Q,
    do_bench=tuning_bench,
)
@triton.jit(do_not_specialize=["n_doc", "lq", "LQ_BUCKET"])
def maxsim_grad_d_atomic_kernel(
    G,
    Q,
    ARGMAX,
    CUQ,
    GD,
    n_doc,
    lq,
    dim,
    LQ_BUCKET,
    LAYOUT: tl.constexpr,
    NORMALIZE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_Q: tl.constexpr,
):
    pair = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    k = tl.arange(0, BLOCK_K)
    k_ok = k < dim
    row_ok = rows < lq
    a = tl.load(ARGMAX + pair * lq + rows, mask=row_ok, other=-1)
    ok = a >= 0
    q_start = _query_start(LAYOUT, CUQ, pair, n_doc, lq)
    g = tl.load(G + pair)
    q = tl.load(
        Q + (q_start + rows)[:, None] * dim + k[None, :],
        mask=ok[:, None] & k_ok[None, :],
        other=0.0,
    )
    q = q.to(tl.float32)
    if NORMALIZE:
        q = q * _inv_norm(q)[:, None]
    tl.atomic_add(
        GD + a.to(tl.int64)[:, None] * dim + k[None, :],
        g * q,
        mask=ok[:, None] & k_ok[None, :],
        sem="relaxed",
    )


@autotune(
    _LOWMEM_CONFIGS,
    key=["BLOCK_K", "LAYOUT"],
    default=_DEFAULT_R,
    interpret_config=_INTERPRET_R,
    do_bench=tuning_bench,
)
@triton.jit(do_not_specialize=["n_rows", "n_doc", "lq"])
def maxsim_grad_d_owner_kernel(
    G,
    Q,
    ORDER,
    OFFSETS,
    CUQ,
    GD,
    n_rows,
    n_doc,
    lq,
    dim,
    LAYOUT: tl.constexpr,
    NORMALIZE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < n_rows
    k = tl.arange(0, BLOCK_K)
    k_ok = k < dim
    start = tl.load(OFFSETS + r, mask=r_ok, other=0)
    count = tl.load(OFFSETS + r + 1, mask=r_ok, other=0) - start
    acc = tl.zeros((BLOCK_R, BLOCK_K), dtype=tl.float32)
    for i in range(0, tl.max(count, 0)):
        has = i < count
        # Rows past their count read ORDER[0], a valid slot, and are dropped by the `where` below.
        # Unmasked loads on purpose: a 1-D mask shared with the 2-D tile below makes Triton 3.6's
        # layout pass on sm_90 emit a load whose mask and pointer layouts differ (compile error).
        slot = tl.load(ORDER + tl.where(has, start + i, 0))
        pair = slot // lq
        t = slot % lq
        q_row = _query_start(LAYOUT, CUQ, pair, n_doc, lq) + t
        g = tl.load(G + pair)
        q = tl.load(Q + q_row[:, None] * dim + k[None, :], mask=k_ok[None, :], other=0.0)
        q = q.to(tl.float32)
        if NORMALIZE:
            q = q * _inv_norm(q)[:, None]
        acc += tl.where(has[:, None], g[:, None] * q, 0.0)
    tl.store(
        GD + r[:, None] * dim + k[None, :],
        acc.to(GD.dtype.element_ty),
        mask=r_ok[:, None] & k_ok[None, :],
    )


@triton.jit
def _hits_times_queries(hit, q, NORMALIZE: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """``hit (R, T) @ q̂ (T, K)`` in fp32, where ``hit`` is 0/1 and ``q̂`` is ``q`` (normalised when
    ``NORMALIZE``). 16-bit queries go through the tensor cores exactly: a 0/1 operand makes every
    product exact, and a normalised row is split into a 16-bit head and tail."""
    if UPCAST or IEEE:  # fp32 (and the interpreter's bf16, whose bf16 dots are wrong): IEEE dot
        x = q.to(tl.float32)
        if NORMALIZE:
            x = x * _inv_norm(x)[:, None]
        out = tl.dot(hit.to(tl.float32), x, input_precision="ieee")
    elif NORMALIZE:
        x = q.to(tl.float32)
        x = x * _inv_norm(x)[:, None]
        head = x.to(q.dtype)
        tail = (x - head.to(tl.float32)).to(q.dtype)
        h = hit.to(q.dtype)
        out = tl.dot(h, head) + tl.dot(h, tail)
    else:
        out = tl.dot(hit.to(q.dtype), q)
    return out


@triton.jit
def _through_normalize_rows(acc, D, rows, row_ok, k, k_ok, dim):
    """``acc`` (the gradient w.r.t. normalised document rows) through ``F.normalize``; rows
    without a contributor stay 0 and their document row is not read."""
    live = tl.sum(tl.where(acc != 0.0, 1, 0), 1) > 0
    x = tl.load(
        D + rows[:, None] * dim + k[None, :],
        mask=(row_ok & live)[:, None] & k_ok[None, :],
        other=0.0,
    ).to(tl.float32)
    return _grad_through_normalize(acc, x)


@triton.jit
def _finish_grad_q_row(
    GQP,
    GQ,
    Q,
    row,
    n_split,
    q_rows,
    dim,
    k,
    k_ok,
    NORMALIZE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """Row ``row`` of grad_Q: its ``n_split`` fp32 partial sums (``GQP``, ``(n_split, q_rows,
    dim)``) added in a fixed order, taken through ``F.normalize`` when ``NORMALIZE``, stored in
    ``GQ``'s dtype."""
    s = tl.arange(0, BLOCK_S)
    acc = tl.zeros((1, BLOCK_K), dtype=tl.float32)
    for s0 in range(0, n_split, BLOCK_S):
        split = s0 + s
        part = tl.load(
            GQP + (split.to(tl.int64)[:, None] * q_rows + row) * dim + k[None, :],
            mask=(split < n_split)[:, None] & k_ok[None, :],
            other=0.0,
        )
        acc += tl.sum(part, 0)[None, :]
    offs = row * dim + k[None, :]
    if NORMALIZE:
        x = tl.load(Q + offs, mask=k_ok[None, :], other=0.0).to(tl.float32)
        acc = _grad_through_normalize(acc, x)
    tl.store(GQ + offs, acc.to(GQ.dtype.element_ty), mask=k_ok[None, :])


@autotune(
    _DENSE_CONFIGS,
    key=["BLOCK_K", "BLOCK_T", "LAYOUT", "NORMALIZE", "ONE_CHUNK", "FINISH_Q"],
    default=_DEFAULT_DENSE,
    interpret_config=_INTERPRET_DENSE,
    do_bench=tuning_bench,
)
@triton.jit(
    do_not_specialize=["n_query", "n_doc", "lq", "ld", "rows_per_program", "n_split", "q_rows"]
)
def maxsim_grad_d_dense_kernel(
    G,
    Q,
    D,
    ARGMAX,
    GD,
    GQP,
    GQ,
    n_query,
    n_doc,
    lq,
    ld,
    rows_per_program,
    dim,
    n_split,
    q_rows,
    LAYOUT: tl.constexpr,
    NORMALIZE: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
    ONE_CHUNK: tl.constexpr,
    FINISH_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """One program per (document, run of ``rows_per_program`` of its rows): every row's gradient,
    zeros included, written once, in order (the runs stream like the forward's reads).

    ``LAYOUT`` 0 (all pairs): the contributors of document ``doc`` are the slots of every query's
    pair with it, weighted by that pair's output gradient; otherwise the document is its own pair
    (the 4-D layout: query ``doc // n_doc``; pairs: query ``doc``, with ``n_doc = 1``).
    ``ONE_CHUNK``: one source query of at most ``BLOCK_T`` tokens, loaded once per program.
    ``FINISH_Q``: the first ``q_rows`` programs of axis 0 instead add up grad_Q's ``n_split``
    partial sums, one row each (the gathered grad_Q ran just before, into ``GQP``): that saves a
    rerank's backward the reduction's and the cast's launches, which cost more host time than
    their GPU work.
    """
    pid = tl.program_id(0)
    k = tl.arange(0, BLOCK_K)
    k_ok = k < dim
    if FINISH_Q:
        if pid < q_rows:
            if tl.program_id(1) == 0:
                _finish_grad_q_row(
                    GQP, GQ, Q, pid.to(tl.int64), n_split, q_rows, dim, k, k_ok, NORMALIZE,
                    BLOCK_K, BLOCK_S,
                )  # fmt: skip
        else:
            _dense_grad_d_rows(
                G, Q, D, ARGMAX, GD, (pid - q_rows).to(tl.int64), n_query, n_doc, lq, ld,
                rows_per_program, dim, k, k_ok, LAYOUT, NORMALIZE, UPCAST, IEEE, ONE_CHUNK,
                BLOCK_K, BLOCK_T, BLOCK_R,
            )  # fmt: skip
    else:
        _dense_grad_d_rows(
            G, Q, D, ARGMAX, GD, pid.to(tl.int64), n_query, n_doc, lq, ld, rows_per_program, dim,
            k, k_ok, LAYOUT, NORMALIZE, UPCAST, IEEE, ONE_CHUNK, BLOCK_K, BLOCK_T, BLOCK_R,
        )  # fmt: skip


@triton.jit
def _dense_grad_d_rows(
    G, Q, D, ARGMAX, GD, doc, n_query, n_doc, lq, ld, rows_per_program, dim, k, k_ok,
    LAYOUT: tl.constexpr, NORMALIZE: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    ONE_CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """The rows of one program of :func:`maxsim_grad_d_dense_kernel`."""
    first = tl.program_id(1) * rows_per_program
    last = tl.minimum(first + rows_per_program, ld)
    t = tl.arange(0, BLOCK_T)
    if ONE_CHUNK:
        g = tl.load(G + doc)
        t_ok = t < lq
        a = tl.load(ARGMAX + doc * lq + t, mask=t_ok, other=-1).to(tl.int64)
        q = tl.load(
            Q + ((doc // n_doc) * lq + t)[:, None] * dim + k[None, :],
            mask=t_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
    for r0 in range(first, last, BLOCK_R):
        local = r0 + tl.arange(0, BLOCK_R)
        row_ok = local < last
        rows = doc * ld + local
        if ONE_CHUNK:
            hit = rows[:, None] == a[None, :]
            acc = g * _hits_times_queries(hit, q, NORMALIZE, UPCAST, IEEE)
        else:
            acc = tl.zeros((BLOCK_R, BLOCK_K), dtype=tl.float32)
            if LAYOUT == 0:
                n_source = n_query
            else:
                n_source = 1
            for s in range(0, n_source):
                if LAYOUT == 0:
                    source = tl.cast(s, tl.int64)  # a Python int under the interpreter
                    pair = source * n_doc + doc
                    q_start = source * lq
                else:
                    pair = doc
                    q_start = (doc // n_doc) * lq
                g_s = tl.load(G + pair)
                for t0 in range(0, lq, BLOCK_T):
                    tt = t0 + t
                    tt_ok = tt < lq
                    a_s = tl.load(ARGMAX + pair * lq + tt, mask=tt_ok, other=-1)
                    hit = rows[:, None] == a_s.to(tl.int64)[None, :]
                    q_s = tl.load(
                        Q + (q_start + tt)[:, None] * dim + k[None, :],
                        mask=tt_ok[:, None] & k_ok[None, :],
                        other=0.0,
                    )
                    acc += g_s * _hits_times_queries(hit, q_s, NORMALIZE, UPCAST, IEEE)
        if NORMALIZE:
            acc = _through_normalize_rows(acc, D, rows, row_ok, k, k_ok, dim)
        tl.store(
            GD + rows[:, None] * dim + k[None, :],
            acc.to(GD.dtype.element_ty),
            mask=row_ok[:, None] & k_ok[None, :],
        )
