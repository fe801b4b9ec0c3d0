"""The specification of MaxSim in plain PyTorch: the CPU path and the oracle of every test.

For a query ``q`` (``Lq`` tokens) and a document ``x`` (``Ld`` tokens) of width ``d``::

    score(q, x) = sum_i  max_j  <q_i, x_j>

with these rules for masks (bool, True = valid token):

* masked document tokens never win the max;
* a query token whose document has no valid token contributes 0 (so an empty document scores 0);
* masked query tokens contribute 0.

Products are accumulated in float32 (float64 for float64 inputs) and scores come back in that
dtype. ``normalize=True`` L2-normalises every token first (``torch.nn.functional.normalize``).

The *argmax* of a query token is the index of its winning document token (the first one on ties),
or ``-1`` when the token is masked or its document has no valid token. It is what the backward pass
needs: ``d score / d q_i = x_argmax(i)`` and ``d score / d x_j = sum of q_i whose argmax is j``.

Work is split into blocks of at most :data:`CHUNK_ELEMENTS` similarity entries, so the
``(Nq, Nd, Lq, Ld)`` tensor of an einsum is never allocated at once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: Similarity entries one block may hold (256 Mi fp32 entries = 1 GiB at most).
CHUNK_ELEMENTS = 1 << 28


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulation and score dtype for inputs of ``dtype``."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _prepare(x: torch.Tensor, normalize: bool) -> torch.Tensor:
    x = x.to(compute_dtype(x.dtype))
    return F.normalize(x, dim=-1) if normalize else x


def block_scores(
    sim: torch.Tensor,
    q_mask: torch.Tensor | None,
    d_mask: torch.Tensor | None,
    *,
    with_argmax: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reduce a similarity block ``(..., Lq, Ld)`` to scores ``(...)`` (and argmax ``(..., Lq)``).

    ``q_mask`` broadcasts against ``(..., Lq)`` and ``d_mask`` against ``(..., Ld)``.
    """
    if d_mask is not None:
        # where() rather than masked_fill keeps NaN of masked tokens out of the max
        sim = torch.where(d_mask.unsqueeze(-2), sim, sim.new_tensor(float("-inf")))
    if sim.shape[-1] == 0:
        best = sim.new_full(sim.shape[:-1], float("-inf"))
        idx = torch.zeros(sim.shape[:-1], dtype=torch.long, device=sim.device)
    elif with_argmax:
        best, idx = sim.max(dim=-1)
    else:
        best, idx = sim.amax(dim=-1), None
    empty = best == float("-inf")
    keep = ~empty if q_mask is None else (~empty & q_mask)
    scores = torch.where(keep, best, best.new_zeros(())).sum(dim=-1)
    if with_argmax:
        idx = torch.where(keep, idx, idx.new_full((), -1))
    return scores, idx


def _check_budget(*sizes: int) -> int:
    if torch.compiler.is_compiling():  # a traced call is one block: its sizes may be symbolic
        return CHUNK_ELEMENTS
    n = 1
    for s in sizes:
        n *= max(int(s), 1)
    return max(CHUNK_ELEMENTS // n, 1)


def maxsim_reference(
    Q: torch.Tensor,
    D: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    normalize: bool = False,
    return_argmax: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """MaxSim of queries ``Q (Nq, Lq, d)`` against documents.

    A 3-D ``D (Nd, Ld, d)`` gives all-pairs scores ``(Nq, Nd)``; a 4-D ``D (Nq, K, Ld, d)`` scores
    each query against its own K documents, ``(Nq, K)``. Masks: ``q_mask (Nq, Lq)``, ``d_mask``
    ``(Nd, Ld)`` or ``(Nq, K, Ld)``. Differentiable. With ``return_argmax`` also returns the local
    argmax indices ``(Nq, Nd|K, Lq)`` (int64, -1 sentinel).
    """
    Qc, Dc = _prepare(Q, normalize), _prepare(D, normalize)
    nq, lq = Q.shape[0], Q.shape[1]
    shared = D.dim() == 3
    nd = D.shape[0] if shared else D.shape[1]
    ld = D.shape[-2]
    out_rows, arg_rows = [], []
    q_step = max(min(nq, _check_budget(lq, ld, nd)), 1)
    d_step = max(min(nd, _check_budget(lq, ld, q_step)), 1)
    for q0 in range(0, nq, q_step):
        q_sl = slice(q0, q0 + q_step)
        qb = Qc[q_sl]
        qm = None if q_mask is None else q_mask[q_sl][:, None, :]
        cols, args = [], []
        for d0 in range(0, nd, d_step):
            d_sl = slice(d0, d0 + d_step)
            if shared:
                sim = torch.einsum("qid,njd->qnij", qb, Dc[d_sl])
                dm = None if d_mask is None else d_mask[d_sl][None, :, :]
            else:
                sim = torch.einsum("qid,qnjd->qnij", qb, Dc[q_sl, d_sl])
                dm = None if d_mask is None else d_mask[q_sl, d_sl]
            s, a = block_scores(sim, qm, dm, with_argmax=return_argmax)
            cols.append(s)
            args.append(a)
        if nd == 0:
            cols.append(Qc.new_zeros((qb.shape[0], 0)))
            args.append(torch.zeros((qb.shape[0], 0, lq), dtype=torch.long, device=Q.device))
        out_rows.append(torch.cat(cols, dim=1))
        if return_argmax:
            arg_rows.append(torch.cat(args, dim=1))
    if nq == 0:
        scores = Qc.new_zeros((0, nd))
        argmax = torch.zeros((0, nd, lq), dtype=torch.long, device=Q.device)
    else:
        scores = torch.cat(out_rows, dim=0)
        argmax = torch.cat(arg_rows, dim=0) if return_argmax else None
    return (scores, argmax) if return_argmax else scores


def maxsim_pairs_reference(
    Q: torch.Tensor,
    D: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    normalize: bool = False,
    return_argmax: bool = False,
):
    """Query ``i`` against document ``i``: ``Q (B, Lq, d)``, ``D (B, Ld, d)`` → ``(B,)``."""
    out = maxsim_reference(
        Q,
        D[:, None],
        q_mask,
        None if d_mask is None else d_mask[:, None],
        normalize=normalize,
        return_argmax=return_argmax,
    )
    if return_argmax:
        return out[0][:, 0], out[1][:, 0]
    return out[:, 0]


def maxsim_varlen_reference(
    Q_packed: torch.Tensor,
    D_packed: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_d: torch.Tensor,
    *,
    normalize: bool = False,
    return_argmax: bool = False,
):
    """Packed variable-length pairs: query ``b`` is ``Q_packed[cu_q[b]:cu_q[b+1]]``, document ``b``
    is ``D_packed[cu_d[b]:cu_d[b+1]]``. Returns ``(B,)`` (and a list of per-pair argmax)."""
    cq, cd = cu_seqlens_q.tolist(), cu_seqlens_d.tolist()
    scores, args = [], []
    for b in range(len(cq) - 1):
        s, a = maxsim_pairs_reference(
            Q_packed[None, cq[b] : cq[b + 1]],
            D_packed[None, cd[b] : cd[b + 1]],
            normalize=normalize,
            return_argmax=True,
        )
        scores.append(s)
        args.append(a[0])
    dtype = compute_dtype(Q_packed.dtype)
    out = torch.cat(scores) if scores else torch.zeros(0, dtype=dtype, device=Q_packed.device)
    return (out, args) if return_argmax else out
