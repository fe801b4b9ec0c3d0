"""``maxsim_mps``, the name colpali-engine and PyLate call on Apple-silicon tensors.

There is no Metal kernel in this package: the call runs :func:`late_interaction_kernels.maxsim`,
whose PyTorch path serves MPS tensors, with the callers' mask rule (see
:mod:`late_interaction_kernels.autograd`).
"""

from __future__ import annotations

import torch

from .autograd import maxsim

__all__ = ["maxsim_mps"]


def maxsim_mps(
    query: torch.Tensor,
    doc: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    normalize: bool = False,
) -> torch.Tensor:
    """MaxSim of ``query (Nq, Lq, d)`` against ``doc (Nd, Ld, d)``; see ``autograd.maxsim``."""
    if normalize:
        query = torch.nn.functional.normalize(query, dim=-1)
        doc = torch.nn.functional.normalize(doc, dim=-1)
    return maxsim(query, doc, q_mask, d_mask)
