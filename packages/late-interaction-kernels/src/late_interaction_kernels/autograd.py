"""Entry point that colpali-engine (>=0.3.17) and PyLate (>=1.6) call from their own
late-interaction backends (``COLPALI_SCORES_BACKEND`` / ``PYLATE_SCORES_BACKEND=lik``).

Those callers replaced an ``einsum`` whose padded or masked document tokens take part in the max
with similarity 0, and they compare against it; this function keeps that rule, so switching
their backend changes speed and memory, not numbers. Use :func:`late_interaction_kernels.maxsim`
directly for the "masked tokens never win" semantics.
"""

from __future__ import annotations

import torch

from .integrations._scoring import as_bool_mask, kernels, zero_masked_tokens, zero_padding_masks

__all__ = ["maxsim"]


def maxsim(
    query: torch.Tensor,
    doc: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """MaxSim scores with the callers' reference semantics.

    Args:
        query: ``(Nq, Lq, d)``, zero-padded.
        doc: ``(Nd, Ld, d)`` for the in-batch grid, or ``(Nq, K, Ld, d)`` for per-query candidates.
        q_mask: bool or 0/1 ``(Nq, Lq)``; masked query tokens add 0. ``None``: zero rows add 0.
        d_mask: bool or 0/1 ``(Nd, Ld)`` / ``(Nq, K, Ld)``; masked document tokens count as
            similarity 0. ``None``: zero rows are padding, which also counts as similarity 0.

    Returns:
        float32 ``(Nq, Nd)`` or ``(Nq, K)``, differentiable in ``query`` and ``doc``.
    """
    fused, _ = kernels()
    q_mask = as_bool_mask(q_mask)
    if q_mask is None:
        q_mask = query.ne(0).any(dim=-1)
    if d_mask is None:
        return fused(query, doc, q_mask, zero_padding_masks(doc))
    return fused(query, zero_masked_tokens(doc, d_mask), q_mask)
