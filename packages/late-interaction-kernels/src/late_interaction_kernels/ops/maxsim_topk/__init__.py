"""Top-k MaxSim search over a document collection without the ``(Nq, Nd)`` score matrix.

On the Triton backend one kernel (:mod:`.kernels`) scores the documents and keeps a running
top-k per program in registers; a second, small pass merges the programs' candidates. The grid
has a fixed number of programs, so memory does not grow with the number of documents. Elsewhere
(and for shapes the kernel does not take) documents are scored ``chunk_size`` at a time with
:func:`maxsim` and a running top-k is merged after each chunk.
"""

from __future__ import annotations

import torch

from triton_dispatch import common_device, select_backend, uses_triton

from ..maxsim import maxsim
from .launch import fused_topk, kernel_takes

__all__ = ["maxsim_topk"]

#: Documents per chunk on the chunked path when ``chunk_size`` is not given.
DEFAULT_CHUNK_SIZE = 8192


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
        s = maxsim(Q, D[start:stop], q_mask, dm, normalize=normalize, backend=backend)
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
            ``Nq · (chunk_size + k)`` scores); the fused kernel ignores it.
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
        elif uses_triton(chosen) and kernel_takes(Q, D, k, q_mask, d_mask):
            out = fused_topk(Q, D, k, q_mask, d_mask, normalize, largest, sorted)
        else:
            step = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
            out = _chunked(Q, D, k, q_mask, d_mask, normalize, step, largest, backend)
    scores, idx = out
    return (scores.squeeze(0), idx.squeeze(0)) if q_was_2d else (scores, idx)
