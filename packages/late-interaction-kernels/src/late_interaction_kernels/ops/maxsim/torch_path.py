"""The reference route's gradients: :class:`ReferenceMaxSim` scores with :mod:`.reference`
(chunked, without a graph, so it never holds the whole similarity tensor) and its backward
scatters from the saved argmax, like the kernels: memory of ``pairs × Lq`` indices instead of every
similarity block autograd would keep, and a tie's gradient going to its first token, as in
``torch.max(dim)`` (``amax`` would split it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common.layout import ALL_PAIRS, GROUPED, PAIRS, VARLEN, num_pairs
from ..common.normalize import normalize_backward
from .reference import compute_dtype, maxsim_reference, maxsim_varlen_reference


def query_rows(
    layout: int, n_pairs: int, n_doc: int, lq: int, cu_q: torch.Tensor | None, device
) -> torch.Tensor:
    """``(n_pairs, lq)`` token row of the flattened queries for every (pair, token) slot; slots
    past a varlen query's end may point past them, but their argmax is -1."""
    t = torch.arange(lq, device=device)
    if layout == VARLEN:
        return cu_q[:-1].to(device=device, dtype=torch.long)[:, None] + t[None, :]
    pairs = torch.arange(n_pairs, device=device)
    query = pairs // n_doc if layout in (ALL_PAIRS, GROUPED) else pairs
    return query[:, None] * lq + t[None, :]


@torch.no_grad()
def forward_torch(
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
    d = Q2.shape[-1]
    n_pairs = num_pairs(layout, n_query, n_doc)
    if layout == VARLEN:
        scores, local = maxsim_varlen_reference(
            Q2, D2, cu_q, cu_d, normalize=normalize, return_argmax=True
        )
        if not save_argmax:
            return scores, Q2.new_empty((0,), dtype=torch.int32)
        argmax = torch.full((n_pairs, lq), -1, dtype=torch.int32, device=Q2.device)
        starts = cu_d[:-1].tolist()
        for b, a in enumerate(local):
            argmax[b, : a.numel()] = torch.where(a >= 0, a + starts[b], a).to(torch.int32)
        return scores, argmax
    Q3 = Q2.view(n_query, lq, d)
    if layout == ALL_PAIRS:
        D3 = D2.view(n_doc, ld, d)
    else:
        k = n_doc if layout == GROUPED else 1
        D3 = D2.view(n_query, k, ld, d)
    dm = d_mask
    if dm is not None and layout in (GROUPED, PAIRS):
        dm = dm.view(D3.shape[:-1])
    if not save_argmax:
        scores = maxsim_reference(Q3, D3, q_mask, dm, normalize=normalize).reshape(n_pairs)
        return scores, Q2.new_empty((0,), dtype=torch.int32)
    scores, local = maxsim_reference(Q3, D3, q_mask, dm, normalize=normalize, return_argmax=True)
    scores = scores.reshape(n_pairs)
    local = local.reshape(n_pairs, lq)
    if layout == ALL_PAIRS:
        doc = torch.arange(n_pairs, device=Q2.device) % max(n_doc, 1)
    else:
        doc = torch.arange(n_pairs, device=Q2.device)
    argmax = torch.where(local >= 0, local + doc[:, None] * ld, local).to(torch.int32)
    return scores, argmax


@torch.no_grad()
def backward_torch(
    grad: torch.Tensor,
    Q2: torch.Tensor,
    D2: torch.Tensor,
    argmax: torch.Tensor,
    cu_q: torch.Tensor | None,
    layout: int,
    n_query: int,
    n_doc: int,
    lq: int,
    normalize: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    ct = compute_dtype(Q2.dtype)
    Qc, Dc = Q2.to(ct), D2.to(ct)
    if normalize:
        Qc, Dc = F.normalize(Qc, dim=-1), F.normalize(Dc, dim=-1)
    n_pairs = num_pairs(layout, n_query, n_doc)
    rows = query_rows(layout, n_pairs, n_doc, lq, cu_q, Q2.device).reshape(-1)
    flat = argmax.reshape(-1).long()
    keep = flat >= 0
    target, rows = flat[keep], rows[keep]
    g = grad.to(ct)[:, None].expand(n_pairs, lq).reshape(-1)[keep][:, None]
    grad_q = torch.zeros(Q2.shape, dtype=ct, device=Q2.device)
    grad_q.index_add_(0, rows, Dc[target] * g)
    grad_d = torch.zeros(D2.shape, dtype=ct, device=D2.device)
    grad_d.index_add_(0, target, Qc[rows] * g)
    if normalize:
        grad_q, grad_d = (
            normalize_backward(grad_q, Q2.to(ct)),
            normalize_backward(grad_d, D2.to(ct)),
        )
    return grad_q.to(Q2.dtype), grad_d.to(D2.dtype)


class ReferenceMaxSim(torch.autograd.Function):
    """Scores ``(pairs,)`` of ``Q``/``D`` in the caller's shapes (any layout but packed all-pairs)
    with the argmax-scatter backward."""

    @staticmethod
    def forward(ctx, Q, D, q_mask, d_mask, cu_q, cu_d, layout, n_query, n_doc, lq, ld, normalize):
        d = Q.shape[-1]
        scores, argmax = forward_torch(
            Q.reshape(-1, d), D.reshape(-1, d), q_mask, d_mask, cu_q, cu_d, layout, n_query,
            n_doc, lq, ld, True, normalize,
        )  # fmt: skip
        ctx.save_for_backward(Q, D, argmax, cu_q)
        ctx.layout, ctx.n_query, ctx.n_doc, ctx.lq, ctx.normalize = (
            layout,
            n_query,
            n_doc,
            lq,
            normalize,
        )
        return scores

    @staticmethod
    def backward(ctx, grad):
        Q, D, argmax, cu_q = ctx.saved_tensors
        d = Q.shape[-1]
        grad_q, grad_d = backward_torch(
            grad.reshape(-1), Q.reshape(-1, d), D.reshape(-1, d), argmax, cu_q, ctx.layout,
            ctx.n_query, ctx.n_doc, ctx.lq, ctx.normalize,
        )  # fmt: skip
        return grad_q.view(Q.shape), grad_d.view(D.shape), *(None,) * 10


__all__ = ["ReferenceMaxSim", "backward_torch", "forward_torch"]
