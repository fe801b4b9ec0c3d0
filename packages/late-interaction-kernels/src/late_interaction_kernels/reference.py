"""Plain-PyTorch references of every scoring function of the package, importable everywhere (no
Triton needed): the ground truth for tests and a slow CPU path.

Mask rules everywhere (bool, True = valid): masked document tokens never win the max, a query
token of an empty (or fully masked) document adds 0, masked query tokens add 0. Half-precision
inputs are computed in float32; float32 and float64 keep their dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .ops.maxsim.reference import maxsim_reference as _maxsim_reference
from .ops.plaid.reference import (
    maxsim_residual_reference,
    plaid_approx_score_reference,
    unpack_residuals_reference,
)
from .ops.varlen.reference import maxsim_varlen_all_pairs_reference, score_pairs_reference

__all__ = [
    "maxsim_from_hidden_reference",
    "maxsim_padded_reference",
    "maxsim_reference",
    "maxsim_reference_scatter",
    "maxsim_reference_varlen",
    "maxsim_residual_reference",
    "plaid_approx_score_reference",
    "unpack_residuals_reference",
]


def _bool(mask: torch.Tensor | None, rank: int) -> torch.Tensor | None:
    if mask is None:
        return None
    mask = mask.bool()
    return mask.unsqueeze(0) if mask.dim() == rank - 1 else mask


def maxsim_reference(
    Q: torch.Tensor,
    D: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    normalize: bool = False,
) -> torch.Tensor:
    """``(Nq, Nd)`` MaxSim of ``Q (Nq, Lq, d)`` against ``D (Nd, Ld, d)``; a 2-D ``Q`` or ``D``
    is one sequence and its axis is squeezed from the result. Masks may be bool or 0/1."""
    if Q.shape[-1] != D.shape[-1]:
        raise ValueError(
            f"embedding dims don't match: Q has d={Q.shape[-1]}, D has d={D.shape[-1]}"
        )
    q_squeeze, d_squeeze = Q.dim() == 2, D.dim() == 2
    Q = Q.unsqueeze(0) if q_squeeze else Q
    D = D.unsqueeze(0) if d_squeeze else D
    scores = _maxsim_reference(Q, D, _bool(q_mask, 2), _bool(d_mask, 2), normalize=normalize)
    if q_squeeze:
        scores = scores.squeeze(0)
    if d_squeeze:
        scores = scores.squeeze(-1)
    return scores


def maxsim_reference_varlen(
    Q: torch.Tensor, D: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_d: torch.Tensor
) -> torch.Tensor:
    """Every packed query against every packed document, ``(Nq, Nd)``."""
    return maxsim_varlen_all_pairs_reference(Q, D, cu_seqlens_q, cu_seqlens_d)


def maxsim_reference_scatter(
    Q_packed: torch.Tensor,
    D_packed: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_d: torch.Tensor,
    pair_q_idx: torch.Tensor,
    pair_d_idx: torch.Tensor,
) -> torch.Tensor:
    """The listed ``(query, document)`` pairs of packed batches, ``(num_pairs,)``."""
    return score_pairs_reference(
        Q_packed, D_packed, cu_seqlens_q, cu_seqlens_d, pair_q_idx, pair_d_idx
    )


def maxsim_padded_reference(
    queries: torch.Tensor,
    documents: torch.Tensor,
    query_lengths: torch.Tensor,
    doc_lengths: torch.Tensor,
) -> torch.Tensor:
    """``(B, C)``: ``queries[b, :query_lengths[b]]`` against each
    ``documents[b, c, :doc_lengths[b, c]]``."""
    lq, ld = queries.shape[1], documents.shape[2]
    q_mask = torch.arange(lq, device=queries.device) < query_lengths.to(queries.device)[:, None]
    d_mask = torch.arange(ld, device=queries.device) < doc_lengths.to(queries.device)[..., None]
    return _maxsim_reference(queries, documents, q_mask, d_mask)


def maxsim_from_hidden_reference(
    Q: torch.Tensor,
    H_d: torch.Tensor,
    W: torch.Tensor,
    b: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    normalize: bool = True,
) -> torch.Tensor:
    """``maxsim(Q, normalize(F.linear(H_d, W, b)), d_mask=d_mask)`` with the projection written
    out; ``W`` is ``(d_out, d_model)``."""
    dtype = torch.float64 if H_d.dtype == torch.float64 else torch.float32
    D = F.linear(H_d.to(dtype), W.to(dtype), None if b is None else b.to(dtype))
    if normalize:
        D = F.normalize(D, dim=-1)
    return maxsim_reference(Q.to(dtype), D, d_mask=d_mask)
