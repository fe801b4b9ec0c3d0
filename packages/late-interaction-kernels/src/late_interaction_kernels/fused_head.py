"""The document side of a ColBERT head fused with MaxSim scoring: :func:`maxsim_from_hidden`."""

from __future__ import annotations

import torch

from .ops.maxsim_from_hidden import maxsim_from_hidden as _from_hidden

__all__ = ["maxsim_from_hidden"]


def maxsim_from_hidden(
    Q: torch.Tensor,
    H_d: torch.Tensor,
    W: torch.Tensor,
    b: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    normalize: bool = True,
    *,
    q_mask: torch.Tensor | None = None,
    chunk_size: int | None = None,
    fused: bool | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """``maxsim(Q, normalize(F.linear(H_d, W, b)), d_mask=d_mask)`` without writing the projected
    documents. Differentiable in ``Q``, ``H_d``, ``W`` and ``b``.

    Args:
        Q: ``(Nq, Lq, d_out)`` or ``(Lq, d_out)`` projected queries.
        H_d: ``(Nd, Ld, d_model)`` document hidden states.
        W: ``(d_out, d_model)``, the ``torch.nn.Linear.weight`` convention; ``b``: ``(d_out,)``.
        d_mask: bool ``(Nd, Ld)`` (or ``(Ld,)``), True = valid token.
        normalize: L2-normalise every projected document token.
        q_mask, chunk_size, fused, backend: keyword-only additions, see
            :func:`late_interaction_kernels.ops.maxsim_from_hidden.maxsim_from_hidden`.

    Returns:
        float32 ``(Nq, Nd)`` (``(Nd,)`` for a 2-D ``Q``).
    """
    squeeze = isinstance(Q, torch.Tensor) and Q.dim() == 2
    if squeeze:
        Q = Q.unsqueeze(0)
        if q_mask is not None and q_mask.dim() == 1:
            q_mask = q_mask.unsqueeze(0)
    if isinstance(d_mask, torch.Tensor) and d_mask.dim() == 1:
        d_mask = d_mask.unsqueeze(0)
    if not isinstance(Q, torch.Tensor) or Q.dim() != 3:
        raise ValueError("Q must be [Lq, d_out] or [Nq, Lq, d_out]")
    if not isinstance(H_d, torch.Tensor) or H_d.dim() != 3:
        raise ValueError("H_d must be [Nd, Ld, d_model]")
    if (
        not isinstance(W, torch.Tensor)
        or W.dim() != 2
        or tuple(W.shape) != (Q.shape[-1], H_d.shape[-1])
    ):
        got = tuple(W.shape) if isinstance(W, torch.Tensor) else type(W).__name__
        raise ValueError(f"W must be [d_out={Q.shape[-1]}, d_model={H_d.shape[-1]}]; got {got}")
    scores = _from_hidden(
        Q, H_d, W.t(), b, d_mask, q_mask=q_mask, normalize=normalize, chunk_size=chunk_size,
        backend=backend, fused=fused,
    )  # fmt: skip
    return scores.squeeze(0) if squeeze else scores
