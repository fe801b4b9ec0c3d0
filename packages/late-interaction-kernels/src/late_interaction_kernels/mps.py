"""``maxsim_mps`` / ``maxsim_inference_mps``, the names colpali-engine and PyLate call on
Apple-silicon tensors.

There is no Metal kernel in this package: the calls run :func:`late_interaction_kernels.maxsim`,
whose PyTorch path serves MPS tensors, with the callers' mask rule (see
:mod:`late_interaction_kernels.autograd`).
"""

from __future__ import annotations

import torch

from .autograd import maxsim

__all__ = ["maxsim_inference_mps", "maxsim_mps"]


def maxsim_mps(
    Q: torch.Tensor,
    D: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    normalize: bool = True,
) -> torch.Tensor:
    """MaxSim of ``Q (Nq, Lq, d)`` against ``D (Nd, Ld, d)``, differentiable; see
    ``autograd.maxsim``."""
    return maxsim(Q, D, q_mask, d_mask, normalize=normalize)


def maxsim_inference_mps(
    Q: torch.Tensor,
    D: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    normalize: bool = True,
) -> torch.Tensor:
    """:func:`maxsim_mps` without an autograd graph."""
    with torch.no_grad():
        return maxsim(Q, D, q_mask, d_mask, normalize=normalize)
