"""The specification of packed (``cu_seqlens``) scoring, one sequence pair at a time.

Query ``i`` is ``Q_packed[cu_seqlens_q[i]:cu_seqlens_q[i+1]]``, document ``j`` is
``D_packed[cu_seqlens_d[j]:cu_seqlens_d[j+1]]``; an empty query or document scores 0. Scores are
float32 (float64 for float64 inputs).
"""

from __future__ import annotations

import torch

from ..maxsim.reference import compute_dtype


def _pair_score(q: torch.Tensor, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if q.shape[0] == 0 or x.shape[0] == 0:
        return torch.zeros((), dtype=dtype, device=q.device)
    return (q.to(dtype) @ x.to(dtype).T).max(dim=-1).values.sum()


def maxsim_varlen_all_pairs_reference(
    Q_packed: torch.Tensor,
    D_packed: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_d: torch.Tensor,
) -> torch.Tensor:
    """Every packed query against every packed document: ``(Nq, Nd)``."""
    cq, cd = cu_seqlens_q.tolist(), cu_seqlens_d.tolist()
    dtype = compute_dtype(Q_packed.dtype)
    rows = [
        torch.stack(
            [_pair_score(Q_packed[cq[i] : cq[i + 1]], D_packed[cd[j] : cd[j + 1]], dtype)
             for j in range(len(cd) - 1)]
        ) if len(cd) > 1 else torch.zeros(0, dtype=dtype, device=Q_packed.device)
        for i in range(len(cq) - 1)
    ]  # fmt: skip
    if not rows:
        return torch.zeros(0, max(len(cd) - 1, 0), dtype=dtype, device=Q_packed.device)
    return torch.stack(rows)


def score_pairs_reference(
    Q_packed: torch.Tensor,
    D_packed: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_d: torch.Tensor,
    pair_q_idx: torch.Tensor,
    pair_d_idx: torch.Tensor,
) -> torch.Tensor:
    """Pair ``k`` is query ``pair_q_idx[k]`` against document ``pair_d_idx[k]``: ``(P,)``."""
    cq, cd = cu_seqlens_q.tolist(), cu_seqlens_d.tolist()
    dtype = compute_dtype(Q_packed.dtype)
    out = [
        _pair_score(Q_packed[cq[i] : cq[i + 1]], D_packed[cd[j] : cd[j + 1]], dtype)
        for i, j in zip(pair_q_idx.tolist(), pair_d_idx.tolist())
    ]
    return torch.stack(out) if out else torch.zeros(0, dtype=dtype, device=Q_packed.device)
