"""``maxsim_residual``: the checks, then its declaration (:mod:`.op`): the fused kernel on the
Triton backend, chunks of decompressed documents through :func:`maxsim` elsewhere."""

from __future__ import annotations

import torch

from triton_dispatch import common_device

from .op import DEFAULT_CHUNK_SIZE, RESIDUAL
from .validation import check_values, validate


def maxsim_residual(
    Q: torch.Tensor,
    centroids: torch.Tensor,
    codes: torch.Tensor,
    packed_residuals: torch.Tensor,
    bucket_weights: torch.Tensor,
    doclens: torch.Tensor,
    *,
    nbits: int,
    q_mask: torch.Tensor | None = None,
    chunk_size: int | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Late-interaction scores of ``Q (Nq, Lq, d)`` against residual-compressed documents.

    On the Triton backend (CUDA tensors) one kernel decompresses each document's tokens in
    registers and scores them: no decompressed token is ever written to memory. Elsewhere the
    documents are decompressed ``chunk_size`` at a time and scored with :func:`maxsim`.

    Args:
        centroids: ``(C, d)``; ``codes``: ``(N,)`` centroid id of every stored token;
            ``packed_residuals``: uint8 ``(N, d * nbits / 8)``; ``bucket_weights``:
            ``(2 ** nbits,)``; ``doclens``: ``(Nd,)`` tokens per document, in storage order.
        nbits: bits per residual dimension (1, 2, 4 or 8).
        q_mask: bool ``(Nq, Lq)``, True = valid query token.
        chunk_size: documents decompressed at a time on the PyTorch path (default
            :data:`DEFAULT_CHUNK_SIZE`); the Triton path needs no chunks.
        backend: ``"triton"``, ``"interpret"`` or ``"torch"`` (default: by device).

    Returns:
        float32 ``(Nq, Nd)``; differentiable in ``Q``. A zero-length document scores 0; it has
        no token to send a gradient through, so scoring one with a ``Q`` that requires grad
        raises ``ValueError``. The collection is validated with one host synchronisation, which
        ``torch.compile`` skips (there a zero-length document gets a zero gradient instead).
    """
    chunk_size = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
    validate(
        Q, centroids, codes, packed_residuals, bucket_weights, doclens, nbits, q_mask, chunk_size
    )
    if not torch.compiler.is_compiling():
        shortest = check_values(codes, doclens, centroids.shape[0])
        if Q.requires_grad and torch.is_grad_enabled() and doclens.numel() and shortest == 0:
            raise ValueError(
                "a zero-length document has no gradient: drop it, or score under torch.no_grad()"
            )
    return _score(
        Q, centroids, codes, packed_residuals, bucket_weights, doclens, nbits, q_mask, chunk_size,
        backend,
    )  # fmt: skip


def maxsim_residual_prechecked(
    Q: torch.Tensor,
    centroids: torch.Tensor,
    codes: torch.Tensor,
    packed_residuals: torch.Tensor,
    bucket_weights: torch.Tensor,
    doclens: torch.Tensor,
    *,
    nbits: int,
    q_mask: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """:func:`maxsim_residual` for a caller that has already checked the collection's values
    (every code indexes a centroid, ``doclens`` add up to the tokens, no zero-length document
    under gradients), as the PLAID wrappers do under their own argument names: the same metadata
    checks, without the host synchronisation that reads the values again."""
    validate(
        Q, centroids, codes, packed_residuals, bucket_weights, doclens, nbits, q_mask,
        DEFAULT_CHUNK_SIZE,
    )  # fmt: skip
    return _score(
        Q, centroids, codes, packed_residuals, bucket_weights, doclens, nbits, q_mask,
        DEFAULT_CHUNK_SIZE, backend,
    )  # fmt: skip


def _score(
    Q, centroids, codes, packed_residuals, bucket_weights, doclens, nbits, q_mask, chunk_size,
    backend,
) -> torch.Tensor:  # fmt: skip
    common_device([Q, doclens])
    if torch.compiler.is_compiling() and Q.dtype == torch.float64:
        backend = "torch"  # eager plans decline float64: traced, it takes the reference
    return RESIDUAL(
        Q.contiguous(), None if q_mask is None else q_mask.contiguous(), centroids.contiguous(),
        codes.contiguous(), packed_residuals.contiguous(), bucket_weights.contiguous(), doclens,
        nbits=nbits, chunk_size=chunk_size, backend=backend,
    )  # fmt: skip
