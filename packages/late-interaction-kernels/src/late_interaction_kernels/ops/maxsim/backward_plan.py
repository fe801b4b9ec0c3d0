"""The backward's launches, planned once per kind of call.

A training step calls the backward with the same metadata every time, and at training sizes the
host work around the kernels (the autotuner's dispatch, Triton's launch path, sizes and grids)
costs as much as the kernels. :class:`BackwardPlan` resolves it once per key and launches the
compiled kernels directly (:class:`triton_dispatch.launch.KernelLaunch`); a call allocates its
outputs and launches.
"""

from __future__ import annotations

import torch
import triton

from triton_dispatch import device_facts, interpreter_enabled, padded_dim, shape_bucket
from triton_dispatch.launch import KernelLaunch, PlanCache

from ..common.buffers import output_buffer
from ..common.layout import ALL_PAIRS, GROUPED, PAIRS, VARLEN, VARLEN_ALL_PAIRS, num_pairs
from ..common.precision import dot_settings
from .backward import (
    NORMALIZE_BLOCK_R,
    maxsim_grad_d_atomic_kernel,
    maxsim_grad_d_dense_kernel,
    maxsim_grad_d_owner_kernel,
    maxsim_grad_q_kernel,
    normalize_backward_kernel,
)

#: The gathered grad_Q splits a query's documents over programs, into fp32 partial sums added
#: afterwards in a fixed order (deterministic): into runs of ``DOCS_PER_SPLIT`` documents, and
#: further (runs down to ``MIN_DOCS_PER_SPLIT``) until the grid has about ``PROGRAMS_PER_SM``
#: programs per SM; at most ``MAX_DOC_SPLITS``. One query against 1000 documents otherwise
#: loops over 1000 documents in a few programs (83 µs on an H100, where the gather reads 8 MB).
DOCS_PER_SPLIT = 32
MIN_DOCS_PER_SPLIT = 8
MAX_DOC_SPLITS = 256
PROGRAMS_PER_SM = 4

#: ``lowmem`` takes the dense kernel (one pass over grad_D, no sort) when every document is scored
#: by queries holding at most this many tokens in all: the 4-D layout, pairs, and all-pairs calls
#: with few queries (a rerank). Above it the CSR kernel's sort is cheaper than matching every
#: query token against every row.
DENSE_MAX_QUERY_TOKENS = 256
#: The dense launch adds up a split grad_Q itself (one extra program per query row) when the
#: queries hold at most this many rows: a rerank (one short query against many documents), whose
#: step is bound by the host, saves the reduction's and the cast's launches. Larger batches keep
#: the reduction launch: their step is bound by the GPU, where one program per row costs more.
FINISH_MAX_QUERY_ROWS = 256
#: Partial sums per load when the dense launch adds up a split grad_Q (a ``(splits, d)`` tile).
FINISH_SPLIT_BLOCK = 32


def uses_dense_kernel(layout: int, n_query: int, lq: int) -> bool:
    """Whether ``lowmem``'s grad_D runs the dense kernel for this call."""
    if layout in (GROUPED, PAIRS):
        return lq <= DENSE_MAX_QUERY_TOKENS
    return layout == ALL_PAIRS and n_query * lq <= DENSE_MAX_QUERY_TOKENS


def invert_argmax(argmax: torch.Tensor, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR inverse of the argmax rows: ``order`` lists (pair, token) slots sorted by the document
    row they point at (stable, so the order is fixed), ``offsets[r]:offsets[r+1]`` are row ``r``'s.
    Slots without a winner (-1) sort before row 0 and belong to no row. Three device ops, no host
    synchronisation."""
    sorted_target, order = torch.sort(argmax.reshape(-1), stable=True)
    rows = torch.arange(n_rows + 1, device=argmax.device, dtype=sorted_target.dtype)
    offsets = torch.searchsorted(sorted_target, rows)
    return order, offsets


def _programs_target(device: torch.device) -> int:
    if device.type == "cuda" and not interpreter_enabled():
        return PROGRAMS_PER_SM * device_facts(device).sm_count
    return 8  # the interpreter: a few programs


def doc_splits(per_query: int, programs: int, target: int) -> int:
    """How many programs share one query block's documents (see :data:`DOCS_PER_SPLIT`)."""
    by_size = triton.cdiv(per_query, DOCS_PER_SPLIT)
    to_fill = triton.cdiv(target, max(programs, 1))
    most = min(triton.cdiv(per_query, MIN_DOCS_PER_SPLIT), MAX_DOC_SPLITS)
    return max(1, min(max(by_size, to_fill), most))


class BackwardPlan:
    """Launches of one backward kind: grad_Q's gather, grad_D by ``method`` and the normalize
    passes, bound to the call's sizes. ``__call__`` allocates the gradients and launches."""

    def __init__(
        self, layout, n_query, n_doc, lq, q_rows, d_rows, dim, dtype, device, method, need_q,
        need_d, normalize,
    ):  # fmt: skip
        if method not in ("unified", "lowmem"):
            raise ValueError(f"backward method {method!r}; expected 'unified' or 'lowmem'")
        self.layout, self.lq, self.dim, self.dtype = layout, lq, dim, dtype
        self.q_rows, self.d_rows, self.device = q_rows, d_rows, device
        self.method, self.need_q, self.need_d, self.normalize = method, need_q, need_d, normalize
        self.n_pairs = num_pairs(layout, n_query, n_doc)
        per_query = n_doc if layout in (ALL_PAIRS, GROUPED, VARLEN_ALL_PAIRS) else 1
        block_k = padded_dim(dim)
        lq_bucket = shape_bucket(lq, minimum=16, maximum=512)
        self.empty = n_query == 0 or lq == 0 or self.n_pairs == 0
        self.n_split = doc_splits(
            per_query, n_query * triton.cdiv(lq, 32), _programs_target(torch.device(device))
        )
        n_split = self.n_split
        self.grad_q = KernelLaunch(
            maxsim_grad_q_kernel,
            lambda meta: (n_query, triton.cdiv(lq, meta["BLOCK_Q"]), n_split),
            dict(
                n_doc=per_query,
                docs_per_split=triton.cdiv(per_query, n_split),
                q_rows=q_rows,
                lq=lq,
                dim=dim,
                LQ_BUCKET=lq_bucket,
                LAYOUT=layout,
                NORMALIZE=normalize,
                BLOCK_K=block_k,
            ),
            device=device,
        )
        self.dense = method == "lowmem" and uses_dense_kernel(layout, n_query, lq)
        self.finish_q = False
        if method == "unified":
            self.grad_d = KernelLaunch(
                maxsim_grad_d_atomic_kernel,
                lambda meta: (self.n_pairs, triton.cdiv(lq, meta["BLOCK_Q"])),
                dict(
                    n_doc=per_query,
                    lq=lq,
                    dim=dim,
                    LQ_BUCKET=lq_bucket,
                    LAYOUT=layout,
                    NORMALIZE=normalize,
                    BLOCK_K=block_k,
                ),
                device=device,
            )
        elif self.dense:
            ld = d_rows // max(self.n_pairs if layout != ALL_PAIRS else n_doc, 1)
            n_docs = n_doc if layout == ALL_PAIRS else self.n_pairs
            # runs of rows per program (multiples of the largest row block) until the grid fills
            splits = min(
                triton.cdiv(_programs_target(device), max(n_docs, 1)), triton.cdiv(ld, 128)
            )
            rows_per_program = triton.cdiv(triton.cdiv(ld, max(splits, 1)), 128) * 128
            upcast, ieee = dot_settings(dtype)
            block_t = padded_dim(min(lq, 64))
            # the dense launch also adds up a split grad_Q (first q_rows programs of its grid)
            self.finish_q = (
                n_split > 1 and q_rows <= FINISH_MAX_QUERY_ROWS and need_q and need_d
                and not self.empty
            )  # fmt: skip
            self.grad_d = KernelLaunch(
                maxsim_grad_d_dense_kernel,
                (n_docs + (q_rows if self.finish_q else 0), triton.cdiv(ld, rows_per_program)),
                dict(
                    n_query=n_query,
                    n_doc=per_query,
                    lq=lq,
                    ld=ld,
                    rows_per_program=rows_per_program,
                    dim=dim,
                    n_split=n_split,
                    q_rows=q_rows,
                    LAYOUT=0 if layout == ALL_PAIRS else 1,
                    NORMALIZE=normalize,
                    UPCAST=upcast,
                    IEEE=ieee,
                    ONE_CHUNK=layout != ALL_PAIRS and lq <= block_t,
                    FINISH_Q=self.finish_q,
                    BLOCK_K=block_k,
                    BLOCK_T=block_t,
                    BLOCK_S=min(padded_dim(n_split), FINISH_SPLIT_BLOCK),
                ),
                device=device,
            )
        else:
            self.grad_d = KernelLaunch(
                maxsim_grad_d_owner_kernel,
                lambda meta: (triton.cdiv(d_rows, meta["BLOCK_R"]),),
                dict(
                    n_rows=d_rows,
                    n_doc=per_query,
                    lq=lq,
                    dim=dim,
                    LAYOUT=layout,
                    NORMALIZE=normalize,
                    BLOCK_K=block_k,
                ),
                device=device,
            )
        self.normalize_q = self._normalize_launch(q_rows)
        self.normalize_d = self._normalize_launch(d_rows)

    def _normalize_launch(self, n_rows: int) -> KernelLaunch:
        return KernelLaunch(
            normalize_backward_kernel,
            (max(triton.cdiv(n_rows, NORMALIZE_BLOCK_R), 1),),
            dict(
                n_rows=n_rows, dim=self.dim, BLOCK_K=padded_dim(self.dim), BLOCK_R=NORMALIZE_BLOCK_R
            ),
            device=self.device,
        )

    def compile_ahead(self) -> None:
        """Compile this backward's launches on background threads while the forward compiles
        (:mod:`triton_dispatch.compile_ahead`), for the padded layouts' arguments."""
        if self.empty or self.layout in (VARLEN, VARLEN_ALL_PAIRS):
            return
        f32, dt, idx = torch.float32, self.dtype, torch.int32  # grads, inputs, argmax
        if self.finish_q:
            self.grad_q.compile_ahead(f32, dt, idx, f32, f32)
            self.grad_d.compile_ahead(f32, dt, dt, idx, dt, f32, dt)
            return
        if self.need_q:
            out = f32 if self.n_split > 1 else dt
            self.grad_q.compile_ahead(f32, dt, idx, f32, out)
            if self.normalize:
                self.normalize_q.compile_ahead(out, dt, out)
        if not self.need_d or self.d_rows == 0:
            return
        if self.method == "unified":
            self.grad_d.compile_ahead(f32, dt, idx, f32, f32)
            if self.normalize:
                self.normalize_d.compile_ahead(f32, dt, f32)
        elif self.dense:
            self.grad_d.compile_ahead(f32, dt, dt, idx, dt, dt, dt)
        else:  # the owner pass reads the argmax's inverse: sort order and row offsets (int64)
            self.grad_d.compile_ahead(f32, dt, torch.int64, torch.int64, f32, dt)
            if self.normalize:
                self.normalize_d.compile_ahead(dt, dt, dt)

    def __call__(self, grad, Q2, D2, argmax, cu_q):
        if grad.dtype != torch.float32:
            grad = grad.to(torch.float32)
        grad = grad.contiguous()
        if self.finish_q:
            return self._dense_with_split_grad_q(grad, Q2, D2, argmax)
        cu = cu_q if cu_q is not None else grad
        grad_q = self._grad_q(grad, Q2, D2, argmax, cu) if self.need_q else None
        grad_d = self._grad_d(grad, Q2, D2, argmax, cu) if self.need_d else None
        return grad_q, grad_d

    def _dense_with_split_grad_q(self, grad, Q2, D2, argmax):
        # two launches: grad_Q's partial sums, then grad_D's dense pass, which also adds them up
        partial = output_buffer((self.n_split, self.q_rows, self.dim), dtype=torch.float32,
                                device=Q2.device)  # fmt: skip
        grad_q = output_buffer(Q2.shape, dtype=Q2.dtype, device=Q2.device)
        grad_d = output_buffer(D2.shape, dtype=D2.dtype, device=D2.device)
        self.grad_q(grad, D2, argmax, grad, partial)
        self.grad_d(grad, Q2, D2, argmax, grad_d, partial, grad_q)
        return grad_q, grad_d

    def _grad_q(self, grad, Q2, D2, argmax, cu):
        # packed rows outside every query (before cu_seqlens_q[0], after cu_seqlens_q[-1]) are
        # never written: those layouts start from zeros
        varlen = self.layout in (VARLEN, VARLEN_ALL_PAIRS)
        if self.n_split > 1:
            shape = (self.n_split, self.q_rows, self.dim)
            out = (
                torch.zeros(shape, dtype=torch.float32, device=Q2.device)
                if varlen
                else output_buffer(shape, dtype=torch.float32, device=Q2.device)
            )
        elif varlen:
            out = torch.zeros_like(Q2)
        else:
            out = output_buffer(Q2.shape, dtype=Q2.dtype, device=Q2.device)
        if self.empty:
            return out.zero_() if out.dim() == 2 else Q2.new_zeros(Q2.shape)
        self.grad_q(grad, D2, argmax, cu, out)
        if self.n_split > 1:
            out = out.sum(0)
        if self.normalize:
            self.normalize_q(out, Q2, out)
        return out.to(Q2.dtype)

    def _grad_d(self, grad, Q2, D2, argmax, cu):
        if self.method == "unified":
            exact = D2.dtype == torch.float32
            acc = torch.zeros(D2.shape, dtype=torch.float32, device=D2.device)
            if not self.empty:
                self.grad_d(grad, Q2, argmax, cu, acc)
            if self.normalize and self.d_rows:
                self.normalize_d(acc, D2, acc)
            return acc if exact else acc.to(D2.dtype)
        grad_d = output_buffer(D2.shape, dtype=D2.dtype, device=D2.device)
        if self.d_rows == 0:
            return grad_d
        if self.empty:
            return grad_d.zero_()
        if self.dense:  # the grad_Q slots are never read (no FINISH_Q)
            self.grad_d(grad, Q2, D2, argmax, grad_d, grad_d, grad_d)
            return grad_d
        order, offsets = invert_argmax(argmax, self.d_rows)
        self.grad_d(grad, Q2, order, offsets, cu, grad_d)
        if self.normalize:
            self.normalize_d(grad_d, D2, grad_d)
        return grad_d


#: Backward plans by metadata.
BACKWARD_PLANS: PlanCache[BackwardPlan] = PlanCache("late_interaction_kernels.maxsim_backward")


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
    meta = (
        layout, n_query, n_doc, lq, Q2.shape[0], D2.shape[0], Q2.shape[-1], Q2.dtype, Q2.device,
        method, need_q, need_d, normalize,
    )  # fmt: skip
    plan = BACKWARD_PLANS.get(meta, lambda: BackwardPlan(*meta))
    return plan(grad, Q2, D2, argmax, cu_q)


__all__ = [
    "BACKWARD_PLANS",
    "DENSE_MAX_QUERY_TOKENS",
    "BackwardPlan",
    "doc_splits",
    "invert_argmax",
    "maxsim_backward_triton",
    "uses_dense_kernel",
]
