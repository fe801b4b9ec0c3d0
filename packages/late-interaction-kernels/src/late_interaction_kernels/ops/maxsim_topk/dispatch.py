"""``maxsim_topk``: the fused kernel for one or two queries on the Triton backend, chunks of
:func:`maxsim` merged into a running top-k everywhere else."""

from __future__ import annotations

import torch

from triton_dispatch import common_device, select_backend, uses_triton

from ..maxsim import maxsim_unchecked
from .launch import fused_topk, kernel_takes

#: Queries up to which the fused kernel serves a call. It scores one (document, query) pair per
#: program, and a document's queries read it from L2; from 4 queries on, ``maxsim``'s kernel for
#: query batches (each document tile read once for a group of queries) is faster, so batches take
#: the chunked path (H100, 20,000 documents of 300 tokens, k = 100: fused 0.52 / 0.73 / 1.31 ms
#: at 1 / 2 / 4 queries; ``maxsim`` + ``torch.topk`` 0.58 / 1.06 / 0.64 ms).
FUSED_MAX_QUERIES = 2
#: Documents per chunk on the chunked path when ``chunk_size`` is not given: at least this many...
MIN_CHUNK_SIZE = 8192
#: ...and up to this many scores per chunk over all queries (1 MiB of float32), so memory stays
#: independent of Nd while small batches score the collection in few chunks.
CHUNK_SCORES = 2**18


def _as_batch(x, name: str, rank: int):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
    if x.dim() == rank - 1:
        return x.unsqueeze(0)
    if x.dim() != rank:
        raise ValueError(
            f"{name} must have {rank - 1} or {rank} dimensions, got shape {tuple(x.shape)}"
        )
    return x


def _chunked(Q, D, k, q_mask, d_mask, normalize, chunk_size, largest, backend):
    best_s = best_i = None
    for start in range(0, D.shape[0], chunk_size):
        stop = min(start + chunk_size, D.shape[0])
        dm = None if d_mask is None else d_mask[start:stop]
        s = maxsim_unchecked(Q, D[start:stop], q_mask, dm, normalize=normalize, backend=backend)
        i = torch.arange(start, stop, device=s.device).expand_as(s)
        if best_s is not None:
            s, i = torch.cat([best_s, s], dim=1), torch.cat([best_i, i], dim=1)
        best_s, where = s.topk(min(k, s.shape[1]), dim=1, largest=largest, sorted=True)
        best_i = i.gather(1, where)
    return best_s, best_i


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
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    q_was_2d = isinstance(Q, torch.Tensor) and Q.dim() == 2
    Q, D = _as_batch(Q, "Q", 3), _as_batch(D, "D", 3)
    q_mask = None if q_mask is None else _as_batch(q_mask, "q_mask", 2)
    d_mask = None if d_mask is None else _as_batch(d_mask, "d_mask", 2)
    if Q.device != D.device:
        raise ValueError(f"Q and D must be on the same device; got {Q.device} and {D.device}")
    k = min(k, D.shape[0])
    with torch.no_grad():
        chosen = select_backend(device=common_device([Q, D]), backend=backend)
        if k == 0 or Q.shape[0] == 0:
            empty = torch.zeros(Q.shape[0], k, device=Q.device)
            out = (empty, empty.long())
        elif (
            uses_triton(chosen)
            and Q.shape[0] <= FUSED_MAX_QUERIES
            and kernel_takes(Q, D, k, q_mask, d_mask)
        ):
            out = fused_topk(Q, D, k, q_mask, d_mask, normalize, largest)
        else:
            step = chunk_size or max(MIN_CHUNK_SIZE, CHUNK_SCORES // Q.shape[0])
            out = _chunked(Q, D, k, q_mask, d_mask, normalize, step, largest, backend)
    scores, idx = out
    return (scores.squeeze(0), idx.squeeze(0)) if q_was_2d else (scores, idx)
