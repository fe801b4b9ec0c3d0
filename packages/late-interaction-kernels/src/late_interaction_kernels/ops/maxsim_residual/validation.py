"""The checks of a ``maxsim_residual`` call: the metadata of the query and of the compressed
collection, and the collection's values in one host synchronisation."""

from __future__ import annotations

import torch

from triton_dispatch import common_device


def _shape(x) -> str:
    return (
        f"{x.dtype} tensor of shape {tuple(x.shape)}"
        if isinstance(x, torch.Tensor)
        else type(x).__name__
    )


def validate(Q, centroids, codes, packed, weights, doclens, nbits, q_mask, chunk_size) -> None:
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


def check_values(codes, doclens, n_centroids: int) -> int:
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
