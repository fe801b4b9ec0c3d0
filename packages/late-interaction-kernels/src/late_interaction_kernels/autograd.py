"""Entry points that colpali-engine (>=0.3.17) and PyLate (>=1.6) call from their own
late-interaction backends (``COLPALI_SCORES_BACKEND`` / ``PYLATE_SCORES_BACKEND=lik``).

Those callers replaced an ``einsum`` whose padded or masked document tokens take part in the max
with similarity 0, and they compare against it; these functions keep that rule, so switching
their backend changes speed and memory, not numbers. Without masks (how colpali-engine calls) the
rule gives exactly :func:`late_interaction_kernels.maxsim`'s scores. Use
:func:`late_interaction_kernels.maxsim` directly for the "masked tokens never win" rule.
"""

from __future__ import annotations

import torch

from .integrations._scoring import as_bool_mask, kernels, zero_masked_tokens, zero_padding_masks

__all__ = ["maxsim", "maxsim_pairs"]


def _call(fn, query, doc, q_mask, d_mask, normalize, backward):
    q_mask = as_bool_mask(q_mask)
    if q_mask is None:
        q_mask = query.ne(0).any(dim=-1)
    kwargs = {"normalize": normalize, "backward": backward}
    if d_mask is None:
        return fn(query, doc, q_mask, zero_padding_masks(doc), **kwargs)
    return fn(query, zero_masked_tokens(doc, d_mask), q_mask, **kwargs)


def maxsim(
    Q: torch.Tensor,
    D: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    normalize: bool = False,
    backward: str | None = None,
) -> torch.Tensor:
    """MaxSim scores with the callers' reference semantics.

    Args:
        Q: ``(Nq, Lq, d)``, zero-padded, or one query ``(Lq, d)`` (scores without the query axis).
        D: ``(Nd, Ld, d)`` for the in-batch grid, or ``(Nq, K, Ld, d)`` for per-query candidates.
        q_mask: bool or 0/1 ``(Nq, Lq)`` (``(Lq,)`` for one query); masked query tokens add 0.
            ``None``: zero rows add 0.
        d_mask: bool or 0/1 ``(Nd, Ld)`` / ``(Nq, K, Ld)``; masked document tokens count as
            similarity 0. ``None``: zero rows are padding, which also counts as similarity 0.
        normalize: L2-normalise every token first.
        backward: ``None``/``"auto"``, ``"unified"`` or ``"lowmem"``.

    Returns:
        float32 ``(Nq, Nd)`` or ``(Nq, K)``, differentiable in ``Q`` and ``D``.
    """
    fused, _ = kernels()
    return _call(fused, Q, D, q_mask, d_mask, normalize, backward)


def maxsim_pairs(
    Q: torch.Tensor,
    D: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    normalize: bool = False,
    backward: str | None = None,
) -> torch.Tensor:
    """Query ``i`` against document ``i`` (``Q (B, Lq, d)``, ``D (B, Ld, d)`` → ``(B,)``), with
    the mask rule of :func:`maxsim` above."""
    _, pairs = kernels()
    return _call(pairs, Q, D, q_mask, d_mask, normalize, backward)
