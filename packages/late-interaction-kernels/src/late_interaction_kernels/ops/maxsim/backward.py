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
from .tuning import tuning_bench

_GQ_CONFIGS = config_space({"BLOCK_Q": [16, 32, 64]}, num_warps=[4, 8], num_stages=[1])
_GD_CONFIGS = config_space({"BLOCK_Q": [16, 32, 64]}, num_warps=[4, 8], num_stages=[1])
_LOWMEM_CONFIGS = config_space({"BLOCK_R": [16, 32, 64]}, num_warps=[4, 8], num_stages=[1])
_INTERPRET_Q = triton.Config({"BLOCK_Q": 16}, num_warps=4, num_stages=1)
_INTERPRET_R = triton.Config({"BLOCK_R": 16}, num_warps=4, num_stages=1)


@triton.jit
def _query_start(LAYOUT: tl.constexpr, CUQ, pair, n_doc, lq):
    if LAYOUT == 3:
        return tl.load(CUQ + pair).to(tl.int64)
    if LAYOUT <= 1:
        return (pair // n_doc).to(tl.int64) * lq
    return pair.to(tl.int64) * lq


@autotune(_GQ_CONFIGS, key=["LQ_BUCKET", "BLOCK_K", "LAYOUT"], interpret_config=_INTERPRET_Q, do_bench=tuning_bench)
@triton.jit
def maxsim_grad_q_kernel(
    G,
    D,
    ARGMAX,
    CUQ,
    GQ,
    n_doc,
    lq,
    dim,
    LQ_BUCKET,
    LAYOUT: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_Q: tl.constexpr,
):
    qi = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)
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
    for j in range(0, n_doc):
        pair = qi.to(tl.int64) * n_doc + j
        g = tl.load(G + pair)
        a = tl.load(ARGMAX + pair * lq + rows, mask=row_ok, other=-1)
        ok = a >= 0
        x = tl.load(
            D + a.to(tl.int64)[:, None] * dim + k[None, :],
            mask=ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        acc += tl.where(ok[:, None], g * x.to(tl.float32), 0.0)
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
    tl.atomic_add(
        GD + a.to(tl.int64)[:, None] * dim + k[None, :],
        g * q.to(tl.float32),
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
        slot = tl.load(ORDER + start + i, mask=has, other=0)
        pair = slot // lq
        t = slot % lq
        q_row = _query_start(LAYOUT, CUQ, pair, n_doc, lq) + t
        g = tl.load(G + pair, mask=has, other=0.0)
        q = tl.load(Q + q_row[:, None] * dim + k[None, :], mask=has[:, None] & k_ok[None, :], other=0.0)
        acc += tl.where(has[:, None], g[:, None] * q.to(tl.float32), 0.0)
    tl.store(GD + r[:, None] * dim + k[None, :], acc.to(GD.dtype.element_ty), mask=r_ok[:, None] & k_ok[None, :])


def invert_argmax(argmax: torch.Tensor, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR inverse of the argmax rows: ``order`` lists (pair, token) slots sorted by the document
    row they point at (stable, so the order is fixed), ``offsets[r]:offsets[r+1]`` are row ``r``'s.
    Slots without a winner sort past the last row. No host synchronisation."""
    target = argmax.reshape(-1).to(torch.int64)
    target = torch.where(target < 0, torch.full_like(target, n_rows), target)
    sorted_target, order = torch.sort(target, stable=True)
    rows = torch.arange(n_rows + 1, device=argmax.device, dtype=torch.int64)
    offsets = torch.searchsorted(sorted_target, rows)
    return order, offsets


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
        # varlen rows past cu_seqlens_q[-1] belong to no query and are never written
        if layout == 3:
            grad_q = torch.zeros_like(Q2)
        else:
            grad_q = output_buffer(Q2.shape, dtype=Q2.dtype, device=Q2.device)
        if n_query > 0 and lq > 0:
            grid = lambda meta: (n_query, triton.cdiv(lq, meta["BLOCK_Q"]))
            maxsim_grad_q_kernel[grid](
                grad, D2, argmax, cu, grad_q, per_query, lq, dim, lq_bucket,
                LAYOUT=layout, BLOCK_K=block_k,
            )  # fmt: skip
    if need_d:
        n_rows = D2.shape[0]
        if method == "unified":
            exact = D2.dtype == torch.float32
            acc = torch.zeros(D2.shape, dtype=torch.float32, device=D2.device)
            if n_pairs > 0 and lq > 0:
                grid = lambda meta: (n_pairs, triton.cdiv(lq, meta["BLOCK_Q"]))
                maxsim_grad_d_atomic_kernel[grid](
                    grad, Q2, argmax, cu, acc, per_query, lq, dim, lq_bucket,
                    LAYOUT=layout, BLOCK_K=block_k,
                )  # fmt: skip
            grad_d = acc if exact else acc.to(D2.dtype)
        elif method == "lowmem":
            grad_d = output_buffer(D2.shape, dtype=D2.dtype, device=D2.device)
            if n_rows > 0:
                order, offsets = invert_argmax(argmax, n_rows)
                grid = lambda meta: (triton.cdiv(n_rows, meta["BLOCK_R"]),)
                maxsim_grad_d_owner_kernel[grid](
                    grad, Q2, order, offsets, cu, grad_d, n_rows, per_query, lq, dim,
                    LAYOUT=layout, BLOCK_K=block_k,
                )  # fmt: skip
        else:
            raise ValueError(f"backward method {method!r}; expected 'unified' or 'lowmem'")
    return grad_q, grad_d
