"""The specification of MaxSim against a ColBERT head's input: project the encoder's hidden
states, optionally L2-normalise, then MaxSim. Plain PyTorch; the oracle of the tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..maxsim.reference import maxsim_reference


def project(
    H_d: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, normalize: bool
) -> torch.Tensor:
    """Document token embeddings ``H_d @ W (+ b)``, L2-normalised when ``normalize``."""
    D = H_d @ W
    if b is not None:
        D = D + b
    return F.normalize(D, dim=-1) if normalize else D


def maxsim_from_hidden_reference(
    Q: torch.Tensor,
    H_d: torch.Tensor,
    W: torch.Tensor,
    b: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    q_mask: torch.Tensor | None = None,
    normalize: bool = True,
) -> torch.Tensor:
    """``maxsim(Q, project(H_d, W, b, normalize), q_mask, d_mask)``: ``(Nq, Nd)``."""
    return maxsim_reference(Q, project(H_d, W, b, normalize), q_mask, d_mask)
