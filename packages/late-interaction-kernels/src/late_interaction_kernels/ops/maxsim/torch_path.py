"""The PyTorch backend of the MaxSim op on the flattened problem of :mod:`..common.layout`.

Forward evaluates :mod:`.reference` (chunked, so it never holds the whole similarity tensor);
backward scatters from the saved argmax indices, like the kernels do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common.layout import ALL_PAIRS, GROUPED, PAIRS, VARLEN, num_pairs, query_rows
from ..common.normalize import normalize_backward
from .reference import compute_dtype, maxsim_reference, maxsim_varlen_reference


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


__all__ = ["backward_torch", "forward_torch"]
