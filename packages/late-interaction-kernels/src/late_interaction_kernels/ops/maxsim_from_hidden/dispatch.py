"""``maxsim_from_hidden``: the checks, then the fused kernel through its declaration (:mod:`.op`),
or chunks of projected documents through :func:`maxsim` (recomputed in the backward when
gradients are needed)."""

from __future__ import annotations

import torch

from triton_dispatch import common_device, select_backend, uses_triton

from .op import DEFAULT_CHUNK_SIZE, FROM_HIDDEN, kernels_cover
from .torch_path import score_in_chunks
from .validation import validate

#: ``fused=None`` runs the fused kernel with at most this many query-token rows (``Nq * Lq``). On
#: an H100 (BENCHMARKS.md) it beat projection + ``maxsim`` 1.7-1.8x for one query against 1000
#: documents, was within run-to-run noise of it at Nq = 64 (0.88x and 1.18x in two runs) and lost
#: at Nq = 128, where each document tile is scored against many query rows and the separate GEMM
#: projects more efficiently. The choice does not depend on whether gradients are needed, so a
#: call returns the same bits with and without autograd (as the published 0.4.5 does); with
#: gradients the chunked composition would be faster at these sizes (the fused backward
#: recomputes the projection), and ``fused=False`` asks for it.
FUSED_MAX_QUERY_ROWS = 512


def maxsim_from_hidden(
    Q: torch.Tensor,
    H_d: torch.Tensor,
    W: torch.Tensor,
    b: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    q_mask: torch.Tensor | None = None,
    normalize: bool = True,
    chunk_size: int | None = None,
    backend: str | None = None,
    fused: bool | None = None,
) -> torch.Tensor:
    """Late-interaction scores of queries against documents given as encoder hidden states.

    ``score[i, j] = maxsim(Q[i], normalize(H_d[j] @ W + b))``: the document side of a ColBERT head
    fused with the scoring. Differentiable in ``Q``, ``H_d``, ``W`` and ``b``.

    Args:
        Q: query token embeddings ``(Nq, Lq, d)`` (already projected and normalised by the head).
        H_d: document hidden states ``(Nd, Ld, h)``.
        W: projection ``(h, d)``; ``b``: optional bias ``(d,)``.
        d_mask, q_mask: bool ``(Nd, Ld)`` / ``(Nq, Lq)``, True = valid. Masked document tokens
            never win; a document with no valid token scores 0 and gets exactly zero gradient.
        normalize: L2-normalise the projected document tokens (ColBERT does).
        chunk_size: documents projected at a time (default :data:`DEFAULT_CHUNK_SIZE`); the
            Triton forward needs no chunks, its backward recomputes the projection per chunk.
        backend: ``"triton"``, ``"interpret"`` or ``"torch"`` (default: by device).
        fused: on the Triton backend, ``True`` runs the fused kernel (the projected documents
            are never written), ``False`` projects one chunk of documents at a time and scores
            it with :func:`maxsim`; ``None`` picks by measured speed: the fused kernel with up
            to :data:`FUSED_MAX_QUERY_ROWS` query rows, else chunks, whether or not gradients
            are needed (the scores are the same bits with and without autograd).

    Returns:
        float32 scores ``(Nq, Nd)``.
    """
    chunk_size = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
    validate(Q, H_d, W, b, d_mask, q_mask, chunk_size)
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {type(normalize).__name__}")
    if fused is not None and not isinstance(fused, bool):
        raise TypeError(f"fused must be None or a bool, got {type(fused).__name__}")
    chosen = select_backend(device=common_device([Q, H_d]), backend=backend)
    if fused is None:
        fused = Q.shape[0] * Q.shape[1] <= FUSED_MAX_QUERY_ROWS
    if fused and uses_triton(chosen) and kernels_cover(Q, H_d):
        return FROM_HIDDEN(
            Q.contiguous(), H_d.contiguous(), W.contiguous(), None if b is None else b.contiguous(),
            None if d_mask is None else d_mask.contiguous(),
            None if q_mask is None else q_mask.contiguous(),
            normalize=normalize, chunk_size=chunk_size, backend=backend,
        )  # fmt: skip
    backend = "torch" if chosen == "torch" else backend
    return score_in_chunks(Q, H_d, W, b, d_mask, q_mask, normalize, chunk_size, backend)
