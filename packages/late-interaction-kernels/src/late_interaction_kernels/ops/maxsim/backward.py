"""Triton backward kernels of MaxSim, driven by the argmax rows saved by the forward pass.

``grad_Q`` is always *gathered*: one program owns a block of query tokens and sums, over the
documents paired with its query, ``grad_score · D[argmax]`` in fp32 registers (no atomics).

``grad_D`` has two methods:

* ``unified`` — one program per (pair, query block) adds ``grad_score · Q`` into an fp32 copy of
  ``grad_D`` with atomics: fastest when few query tokens collide on one document token, needs a
  full-size fp32 buffer (for bf16/fp16 inputs) and is not bitwise reproducible.
* ``lowmem`` — destination-owned: the argmax rows are inverted into a sorted list (CSR) of the query
  tokens that point at each document row; one program owns a block of document rows and sums its
  contributors in fp32 registers, in a fixed order, and writes ``grad_D`` in the input dtype. No
  atomics, no fp32 buffer, bitwise reproducible.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_dispatch import autotune, config_space, padded_dim, shape_bucket

from .buffers import output_buffer
from .layout import num_pairs
from .tuning import tuning_bench, tuning_space

_DEFAULT_Q = triton.Config({"BLOCK_Q": 32}, num_warps=4, num_stages=1)
_DEFAULT_R = triton.Config({"BLOCK_R": 32}, num_warps=4, num_stages=1)
_GQ_CONFIGS = tuning_space(
    config_space({"BLOCK_Q": [16, 32, 64]}, num_warps=[4, 8], num_stages=[1]), _DEFAULT_Q
)
_GD_CONFIGS = tuning_space(
    config_space({"BLOCK_Q": [16, 32, 64]}, num_warps=[4, 8], num_stages=[1]), _DEFAULT_Q
)
_LOWMEM_CONFIGS = tuning_space(
    config_space({"BLOCK_R": [16, 32, 64]}, num_warps=[4, 8], num_stages=[1]), _DEFAULT_R
)
#: Rows per program of the in-place normalize backward. Not autotuned: autotune trials would run
#: the in-place update many times on the same buffer (a memory-bound pass; one size is as good).
NORMALIZE_BLOCK_R = 16
_INTERPRET_Q = triton.Config({"BLOCK_Q": 16}, num_warps=4, num_stages=1)
_INTERPRET_R = triton.Config({"BLOCK_R": 16}, num_warps=4, num_stages=1)


@triton.jit
def _inv_norm(x):
    return 1.0 / tl.maximum(tl.sqrt(tl.sum(x * x, 1)), 1e-12)


@triton.jit
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
    norm = tl.sqrt(tl.sum(x * x, 1))
    inv = 1.0 / tl.maximum(norm, 1e-12)
    x_hat = x * inv[:, None]
    # below eps F.normalize divides by the constant eps: no projection term
    proj = tl.where(norm > 1e-12, tl.sum(g * x_hat, 1), 0.0)
    out = inv[:, None] * (g - proj[:, None] * x_hat)
    tl.store(OUT + offs, out.to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _query_start(LAYOUT: tl.constexpr, CUQ, pair, n_doc, lq):
    # first Q2 row of each pair's query (one return: the branches are resolved at compile time)
    if LAYOUT == 3:
        start = tl.load(CUQ + pair).to(tl.int64)
    elif LAYOUT <= 1:
        start = (pair // n_doc).to(tl.int64) * lq
    else:
        start = pair.to(tl.int64) * lq
    return start


@autotune(
    _GQ_CONFIGS,
    key=["LQ_BUCKET", "BLOCK_K", "LAYOUT", "NORMALIZE"],
    interpret_config=_INTERPRET_Q,
    do_bench=tuning_bench,
)
@triton.jit
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
    if LAYOUT == 3:
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
    reset_to_zero=["GD"],
    interpret_config=_INTERPRET_Q,
    do_bench=tuning_bench,
)
@triton.jit
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


@autotune(_LOWMEM_CONFIGS, key=["BLOCK_K", "LAYOUT"], interpret_config=_INTERPRET_R, do_bench=tuning_bench)
@triton.jit
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
    tl.store(GD + r[:, None] * dim + k[None, :], acc.to(GD.dtype.element_ty), mask=r_ok[:, None] & k_ok[None, :])


def invert_argmax(argmax: torch.Tensor, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR inverse of the argmax rows: ``order`` lists (pair, token) slots sorted by the document
    row they point at (stable, so the order is fixed), ``offsets[r]:offsets[r+1]`` are row ``r``'s.
    Slots without a winner (-1) sort before row 0 and belong to no row. Three device ops, no host
    synchronisation (each op costs host time comparable to the kernels at training sizes)."""
    sorted_target, order = torch.sort(argmax.reshape(-1), stable=True)
    rows = torch.arange(n_rows + 1, device=argmax.device, dtype=sorted_target.dtype)
    offsets = torch.searchsorted(sorted_target, rows)
    return order, offsets


def _through_normalize(grad_hat: torch.Tensor, x: torch.Tensor) -> None:
    """Turn, in place, the gradient w.r.t. normalised rows into the gradient w.r.t. ``x``."""
    n_rows, dim = x.shape
    if n_rows == 0:
        return
    grid = (triton.cdiv(n_rows, NORMALIZE_BLOCK_R),)
    normalize_backward_kernel[grid](
        grad_hat, x, grad_hat, n_rows, dim, BLOCK_K=padded_dim(dim), BLOCK_R=NORMALIZE_BLOCK_R
    )


#: The gathered grad_Q splits a query's documents over programs once it has more than this many
#: (a PyLate batch of 256 would otherwise loop over 256 documents in one program), into at most
#: MAX_DOC_SPLITS fp32 partial sums added afterwards in a fixed order (deterministic).
DOCS_PER_SPLIT = 32
MAX_DOC_SPLITS = 8


def _grad_q(grad, Q2, D2, argmax, cu, layout, n_query, per_query, lq, normalize) -> torch.Tensor:
    rows, dim = Q2.shape
    n_split = min(triton.cdiv(per_query, DOCS_PER_SPLIT), MAX_DOC_SPLITS)
    if layout == 3:  # varlen rows past cu_seqlens_q[-1] belong to no query and are never written
        out = torch.zeros_like(Q2)
    elif n_split > 1:
        out = output_buffer((n_split, rows, dim), dtype=torch.float32, device=Q2.device)
    else:
        out = output_buffer(Q2.shape, dtype=Q2.dtype, device=Q2.device)
    if n_query == 0 or lq == 0:
        return out.zero_() if out.dim() == 2 else out.new_zeros(Q2.shape).to(Q2.dtype)
    grid = lambda meta: (n_query, triton.cdiv(lq, meta["BLOCK_Q"]), n_split)
    maxsim_grad_q_kernel[grid](
        grad, D2, argmax, cu, out, per_query, triton.cdiv(per_query, n_split), rows, lq, dim,
        shape_bucket(lq, minimum=16, maximum=512),
        LAYOUT=layout, NORMALIZE=normalize, BLOCK_K=padded_dim(dim),
    )  # fmt: skip
    if n_split > 1:
        out = out.sum(0)
    if normalize:
        _through_normalize(out, Q2)
    return out.to(Q2.dtype)


def maxsim_backward_triton(
    grad: torch.Tensor,
    Q2: torch.Tensor,
    D2: torch.Tensor,
    argmax: torch.Tensor,
    cu_q: torch.Tensor | None,
    layout: int,
    n_query: int,
    n_doc: int,
    lq: int,
    method: str,
    need_q: bool = True,
    need_d: bool = True,
    normalize: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(grad_Q2, grad_D2)`` in the inputs' dtype; ``method`` is ``"unified"`` or ``"lowmem"``."""
    dim = Q2.shape[-1]
    n_pairs = num_pairs(layout, n_query, n_doc)
    grad = grad.to(torch.float32).contiguous()
    block_k = padded_dim(dim)
    lq_bucket = shape_bucket(lq, minimum=16, maximum=512)
    per_query = n_doc if layout in (0, 1) else 1
    dummy = grad
    cu = cu_q if cu_q is not None else dummy
    grad_q = grad_d = None
    if need_q:
        grad_q = _grad_q(grad, Q2, D2, argmax, cu, layout, n_query, per_query, lq, normalize)
    if need_d:
        n_rows = D2.shape[0]
        if method == "unified":
            exact = D2.dtype == torch.float32
            acc = torch.zeros(D2.shape, dtype=torch.float32, device=D2.device)
            if n_pairs > 0 and lq > 0:
                grid = lambda meta: (n_pairs, triton.cdiv(lq, meta["BLOCK_Q"]))
                maxsim_grad_d_atomic_kernel[grid](
                    grad, Q2, argmax, cu, acc, per_query, lq, dim, lq_bucket,
                    LAYOUT=layout, NORMALIZE=normalize, BLOCK_K=block_k,
                )  # fmt: skip
            if normalize:
                _through_normalize(acc, D2)
            grad_d = acc if exact else acc.to(D2.dtype)
        elif method == "lowmem":
            grad_d = output_buffer(D2.shape, dtype=D2.dtype, device=D2.device)
            if n_rows > 0:
                order, offsets = invert_argmax(argmax, n_rows)
                grid = lambda meta: (triton.cdiv(n_rows, meta["BLOCK_R"]),)
                maxsim_grad_d_owner_kernel[grid](
                    grad, Q2, order, offsets, cu, grad_d, n_rows, per_query, lq, dim,
                    LAYOUT=layout, NORMALIZE=normalize, BLOCK_K=block_k,
                )  # fmt: skip
                if normalize:
                    _through_normalize(grad_d, D2)
        else:
            raise ValueError(f"backward method {method!r}; expected 'unified' or 'lowmem'")
    return grad_q, grad_d
