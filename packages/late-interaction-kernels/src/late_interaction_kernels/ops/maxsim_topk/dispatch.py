"""``maxsim_topk``: 2-D queries and documents as batches of one, then its declaration
(:mod:`.op`): the fused kernel for one or two queries on the Triton backend, chunks of
:func:`maxsim` merged into a running top-k everywhere else."""

from __future__ import annotations

import torch

from .op import TOPK


def _as_batch(x, rank: int):
    """``x`` one dimension short of ``rank`` as a batch of one (anything else as given: the
    declaration's checks name it)."""
    return x.unsqueeze(0) if isinstance(x, torch.Tensor) and x.dim() == rank - 1 else x


def maxsim_topk(
    Q: torch.Tensor,
    D: torch.Tensor,
    k: int,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    normalize: bool = False,
    chunk_size: int | None = None,
    largest: bool = True,
    sorted: bool = True,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` best-scoring documents per query (inference: no autograd graph).

    Args:
        Q: ``(Nq, Lq, d)`` or ``(Lq, d)`` queries; D: ``(Nd, Ld, d)`` or ``(Ld, d)`` documents.
        k: results per query, clamped to ``Nd``; must be positive.
        q_mask, d_mask: bool ``(Nq, Lq)`` / ``(Nd, Ld)``, True = valid token.
        normalize: L2-normalise every token first.
        chunk_size: score this many documents at a time and merge (bounds memory at
            ``Nq · (chunk_size + k)`` scores; default: :data:`CHUNK_SCORES` scores over the
            queries, at least :data:`MIN_CHUNK_SIZE` documents); the fused kernel ignores it.
        largest, sorted: as in :func:`torch.topk`.
        backend: ``"triton"``, ``"interpret"`` or ``"torch"`` (default: by device).

    Returns:
        ``(scores float32, indices int64)``, each ``(Nq, min(k, Nd))`` (``(min(k, Nd),)`` for a
        2-D ``Q``).
    """
    squeeze = isinstance(Q, torch.Tensor) and Q.dim() == 2
    scores, idx = TOPK(
        _as_batch(Q, 3), _as_batch(D, 3), _as_batch(q_mask, 2), _as_batch(d_mask, 2), k=k,
        normalize=normalize, chunk_size=chunk_size, largest=largest, backend=backend,
    )  # fmt: skip
    return (scores.squeeze(0), idx.squeeze(0)) if squeeze else (scores, idx)
