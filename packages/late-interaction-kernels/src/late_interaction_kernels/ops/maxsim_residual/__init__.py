"""MaxSim against PLAID / ColBERTv2 compressed documents (centroid id + packed n-bit residuals).

The Triton path (:mod:`.kernels`, wrapped as custom ops in :mod:`.op`) decompresses each document
tile in registers and scores it at once; the collection is never expanded. The PyTorch path
decompresses a chunk of documents at a time (one chunk of ``(tokens, d)`` embeddings exists at once)
and scores it with :func:`late_interaction_kernels.maxsim`. The storage layout is described in
:mod:`.reference`.
"""

from __future__ import annotations

import torch

from triton_dispatch import common_device, select_backend, uses_triton

from ..maxsim import maxsim_unchecked
from .op import residual_forward_op
from .reference import decompress

__all__ = ["maxsim_residual", "maxsim_residual_prechecked"]

#: Documents decompressed per chunk when none is given.
DEFAULT_CHUNK_SIZE = 1024


def _shape(x) -> str:
    return (
        f"{x.dtype} tensor of shape {tuple(x.shape)}"
        if isinstance(x, torch.Tensor)
        else type(x).__name__
    )


def _validate(Q, centroids, codes, packed, weights, doclens, nbits, q_mask, chunk_size) -> None:
    if not isinstance(Q, torch.Tensor) or Q.dim() != 3 or not Q.is_floating_point():
        raise ValueError(f"Q must be a floating (Nq, Lq, d) tensor, got {_shape(Q)}")
    if isinstance(nbits, bool) or nbits not in (1, 2, 4, 8):
        raise ValueError(f"nbits must be 1, 2, 4 or 8, got {nbits!r}")
    dim = Q.shape[-1]
    if (
        not isinstance(centroids, torch.Tensor)
        or centroids.dim() != 2
        or centroids.shape[1] != dim
        or not centroids.is_floating_point()
    ):
        raise ValueError(f"centroids must be a floating (C, {dim}) tensor, got {_shape(centroids)}")
    if (dim * nbits) % 8:
        raise ValueError(
            f"d * nbits must be a multiple of 8 to pack residuals, got d={dim}, nbits={nbits}"
        )
    if (
        not isinstance(codes, torch.Tensor)
        or codes.dim() != 1
        or codes.is_floating_point()
        or codes.dtype == torch.bool
    ):
        raise ValueError(f"codes must be an integer (N,) tensor, got {_shape(codes)}")
    n_tok = codes.shape[0]
    width = dim * nbits // 8
    if (
        not isinstance(packed, torch.Tensor)
        or packed.dtype != torch.uint8
        or tuple(packed.shape) != (n_tok, width)
    ):
        raise ValueError(
            f"packed_residuals must be a uint8 (N, d * nbits / 8) = ({n_tok}, {width}) tensor "
            f"with N = len(codes), got {_shape(packed)}"
        )
    if (
        not isinstance(weights, torch.Tensor)
        or tuple(weights.shape) != (1 << nbits,)
        or not weights.is_floating_point()
    ):
        raise ValueError(
            f"bucket_weights must be a floating ({1 << nbits},) tensor, got {_shape(weights)}"
        )
    if (
        not isinstance(doclens, torch.Tensor)
        or doclens.dim() != 1
        or doclens.is_floating_point()
        or doclens.dtype == torch.bool
    ):
        raise ValueError(f"doclens must be an integer (Nd,) tensor, got {_shape(doclens)}")
    if q_mask is not None and (
        not isinstance(q_mask, torch.Tensor)
        or q_mask.dtype != torch.bool
        or q_mask.shape != Q.shape[:2]
    ):
        raise ValueError(
            f"q_mask must be a bool tensor of shape {tuple(Q.shape[:2])}, got {_shape(q_mask)}"
        )
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    common_device(
        [Q, centroids, codes, packed, weights, doclens],
        names=["Q", "centroids", "codes", "packed_residuals", "bucket_weights", "doclens"],
    )


def _check_values(codes, doclens, n_centroids: int) -> int:
    """Data checks of the collection, in one host synchronisation; returns the shortest document
    length (0 without documents)."""
    n_tok = codes.shape[0]
    zero = doclens.new_zeros((), dtype=torch.int64)
    has_docs, has_tokens = doclens.numel() > 0, n_tok > 0
    stats = torch.stack(
        [
            doclens.sum().to(torch.int64) if has_docs else zero,
            doclens.min().to(torch.int64) if has_docs else zero,
            codes.min().to(torch.int64) if has_tokens else zero,
            codes.max().to(torch.int64) if has_tokens else zero,
        ]
    ).tolist()
    total, shortest, lo, hi = stats
    if shortest < 0:
        raise ValueError("doclens must be non-negative")
    if total != n_tok:
        raise ValueError(f"doclens must add up to the number of tokens ({n_tok}), got {total}")
    if has_tokens and (lo < 0 or hi >= n_centroids):
        raise ValueError(f"codes must index centroids, i.e. lie in [0, {n_centroids})")
    return shortest


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
    _validate(
        Q, centroids, codes, packed_residuals, bucket_weights, doclens, nbits, q_mask, chunk_size
    )
    if not torch.compiler.is_compiling():
        shortest = _check_values(codes, doclens, centroids.shape[0])
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
    _validate(
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
    device = common_device([Q, doclens])
    chosen = select_backend(device=device, backend=backend)
    needs_grad = Q.requires_grad and torch.is_grad_enabled()
    if uses_triton(chosen) and Q.dtype != torch.float64:
        offsets = torch.cat([doclens.new_zeros(1), doclens.cumsum(0)]).to(torch.int64)
        scores, _ = residual_forward_op(
            Q.contiguous(),
            None if q_mask is None else q_mask.contiguous(),
            centroids.contiguous(),
            codes.contiguous(),
            packed_residuals.contiguous(),
            bucket_weights.contiguous(),
            offsets,
            nbits,
            needs_grad,
        )
        return scores
    return _decompress_and_score(
        Q, centroids, codes, packed_residuals, bucket_weights, doclens, nbits, q_mask, chunk_size,
        "torch" if chosen == "torch" else None,
    )  # fmt: skip


def _decompress_and_score(
    Q, centroids, codes, packed, weights, doclens, nbits, q_mask, chunk_size, backend
) -> torch.Tensor:
    """The PyTorch path: decompress ``chunk_size`` documents at a time, then :func:`maxsim`."""
    lengths = [int(n) for n in doclens.tolist()]
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    blocks = []
    for start in range(0, len(lengths), chunk_size):
        stop = min(start + chunk_size, len(lengths))
        lo, hi = offsets[start], offsets[stop]
        tokens = decompress(centroids, codes[lo:hi], packed[lo:hi], weights, nbits).to(Q.dtype)
        chunk_lengths = torch.tensor(lengths[start:stop], device=Q.device)
        width = max(max(lengths[start:stop]), 1)
        # scatter the chunk's tokens into a padded (docs, width, d) block
        doc_of_token = torch.repeat_interleave(
            torch.arange(stop - start, device=Q.device), chunk_lengths
        )
        slot = torch.arange(hi - lo, device=Q.device) - (
            torch.tensor(offsets[start:stop], device=Q.device) - lo
        ).repeat_interleave(chunk_lengths)
        D = tokens.new_zeros(stop - start, width, tokens.shape[1])
        D[doc_of_token, slot] = tokens
        mask = torch.arange(width, device=Q.device) < chunk_lengths[:, None]
        blocks.append(maxsim_unchecked(Q, D, q_mask, mask, backend=backend))
    if not blocks:
        return Q.new_zeros(Q.shape[0], 0, dtype=torch.float32)
    return torch.cat(blocks, dim=1)
