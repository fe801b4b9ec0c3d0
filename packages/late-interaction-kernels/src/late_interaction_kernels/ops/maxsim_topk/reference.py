"""The specification of top-k MaxSim search: score every document, keep the ``k`` best (or
worst) per query, as :func:`torch.topk` would on the full score matrix."""

from __future__ import annotations

import torch

from ..maxsim.reference import maxsim_reference


def maxsim_topk_reference(
    Q: torch.Tensor,
    D: torch.Tensor,
    k: int,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    normalize: bool = False,
    largest: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scores, indices)``, each ``(Nq, min(k, Nd))``, sorted best first."""
    scores = maxsim_reference(Q, D, q_mask, d_mask, normalize=normalize)
    return scores.topk(min(k, D.shape[0]), dim=1, largest=largest, sorted=True)
