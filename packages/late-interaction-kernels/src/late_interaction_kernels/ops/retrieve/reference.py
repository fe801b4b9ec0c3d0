"""The specification of brute-force late-interaction retrieval: score every document, keep the
``k`` best per query. The oracle of the chunked implementation's tests."""

from __future__ import annotations

import torch

from ..maxsim.reference import maxsim_reference


def retrieve_reference(
    Q: torch.Tensor,
    D: torch.Tensor,
    k: int,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    normalize: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` ``(scores, indices)``, each ``(Nq, k)``, of ``maxsim(Q, D)`` along documents,
    best first."""
    scores = maxsim_reference(Q, D, q_mask, d_mask, normalize=normalize)
    return scores.topk(k, dim=1)
