"""MaxSim's host plans: :class:`MaxSimPlan`, what the declaration (:mod:`.op`) binds once per kind
of call, and :class:`ForwardPlan`, the forward launch it holds (kernel, grid, constexprs and output
shapes from metadata alone). A warm forward call runs from the declaration through this module to
the launch; the kernels are in :mod:`.forward`, the backward's plans in :mod:`.backward_plan`.
"""

from __future__ import annotations

import math

import torch
import triton

from triton_dispatch import interpreter_enabled, padded_dim, shape_bucket
from triton_dispatch.launch import KernelLaunch, PlanCache

from ..common import buffers, tma
from ..common.layout import ALL_PAIRS, VARLEN, VARLEN_ALL_PAIRS, num_pairs
from ..common.precision import NORM_EPS, dot_settings
from .backward_plan import BACKWARD_PLANS, BackwardPlan
from .forward import (
    maxsim_fwd_kernel,
    maxsim_fwd_query_group_kernel,
    maxsim_fwd_tma_kernel,
)
from .routing import resolve_backward, sizes

#: Queries longer than this are scored in chunks of :data:`QUERY_CHUNK` tokens.
LONG_QUERY_THRESHOLD = 512
QUERY_CHUNK = 128


def _output(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # buffers.output_buffer inline: the tests' poisoning without a call into another module
    out = torch.empty(shape, dtype=dtype, device=device)
    if buffers.POISON_OUTPUTS:
        from triton_dispatch.testing import poison_

        poison_(out)
    return out


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
        partial = _output((n_pairs, self.n_chunks), torch.float32, self.device)
        if not self.save_argmax:
            argmax = self.no_argmax
        elif self.varlen:  # slots past a query's own length are never written
            argmax = torch.full((n_pairs, lq), -1, dtype=torch.int32, device=self.device)
        else:
            argmax = _output((n_pairs, lq), torch.int32, self.device)
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


class MaxSimPlan:
    """The launches of one kind of call, bound once: the forward plan
    (:class:`.forward.ForwardPlan`) over the flattened tokens, and the backward plan
    (:class:`.backward_plan.BackwardPlan`) of the gradients autograd will ask for, compiled beside
    the forward's kernels. ``forward`` views the caller's tensors as token rows (copying only a
    strided one) and returns the scores in the caller's shape."""

    def __init__(self, named, forward: bool) -> None:
        Q, D = named["Q"], named["D"]
        self.layout, nq, nd, lq, self.ld, self.shape = sizes(named)
        self.dim, dtype, device, normalize = Q.shape[-1], Q.dtype, Q.device, named["normalize"]
        self.q_rows, self.d_rows = math.prod(Q.shape[:-1]), math.prod(D.shape[:-1])
        method = resolve_backward(named["backward"], self.layout, nq, nd, lq)
        self._backward_meta = (self.layout, nq, nd, lq, self.q_rows, self.d_rows, self.dim, dtype,
                               device, method)  # fmt: skip
        self._normalize, self._plans, self._new = normalize, BACKWARD_PLANS, BackwardPlan
        self.needs, self.bound = (Q.requires_grad, D.requires_grad), None
        if not forward:
            return
        save_argmax = named["save_argmax"]
        meta = (self.layout, nq, nd, lq, self.ld, self.dim, dtype, device,
                named["q_mask"] is not None, named["d_mask"] is not None, save_argmax, normalize,
                self.q_rows, self.d_rows)  # fmt: skip
        self.launch = FORWARD_PLANS.get(meta, lambda: ForwardPlan(*meta))
        if save_argmax:  # its kernels compile beside the forward's
            self.bound = self._backward_plan(self.needs, compile_ahead=True)

    def _backward_plan(self, needs, compile_ahead: bool = False):
        meta = (*self._backward_meta, *needs, self._normalize)

        def build():
            plan = self._new(*meta)
            if compile_ahead:
                plan.compile_ahead()
            return plan

        return self._plans.get(meta, build)

    def forward(self, Q, D, q_mask, d_mask, cu_q, cu_d):
        Q2 = Q.reshape(self.q_rows, self.dim).contiguous()
        D2 = D.reshape(self.d_rows, self.dim).contiguous()
        qm = None if q_mask is None else q_mask.contiguous()
        dm = None if d_mask is None else d_mask.contiguous().view(-1, self.ld)
        scores, argmax = self.launch(Q2, D2, qm, dm, cu_q, cu_d)
        return scores.view(self.shape), argmax

    def backward(self, grad, Q, D, argmax, cu_q, cu_d, needs):
        needs = tuple(needs)
        bound = needs == self.needs and self.bound is not None
        plan = self.bound if bound else self._backward_plan(needs)
        gq, gd = plan(grad.reshape(-1), Q.view(self.q_rows, self.dim),
                      D.view(self.d_rows, self.dim), argmax, cu_q)  # fmt: skip
        return None if gq is None else gq.view(Q.shape), None if gd is None else gd.view(D.shape)
