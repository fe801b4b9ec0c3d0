"""The checks of the PLAID wrappers: the query and the index tensors, named as the caller passed
them, and the codes of real tokens."""

from __future__ import annotations

import torch

from ..common.packed import check_devices


def check_common(Q, residuals, centroids, bucket_weights, nbits) -> tuple[torch.Tensor, bool]:
    if isinstance(nbits, bool) or nbits not in (2, 4, 8):
        raise ValueError(f"nbits must be 2, 4, or 8; got {nbits!r}")
    if not isinstance(Q, torch.Tensor) or Q.dim() not in (2, 3) or not Q.is_floating_point():
        raise ValueError("Q must be a floating [Nq, Lq, d] or [Lq, d] tensor")
    squeeze = Q.dim() == 2
    Q = Q.unsqueeze(0) if squeeze else Q
    d = Q.shape[-1]
    if (d * nbits) % 8:
        raise ValueError(f"d * nbits must be a multiple of 8, got d={d}, nbits={nbits}")
    if residuals.shape[-1] != d * nbits // 8:
        raise ValueError(
            f"residuals last dim {residuals.shape[-1]} != expected {d * nbits // 8} "
            f"for d={d}, nbits={nbits}"
        )
    if not isinstance(centroids, torch.Tensor) or centroids.dim() != 2 or centroids.shape[1] != d:
        raise ValueError(f"centroids must be [n_centroids, d={d}]")
    if not isinstance(bucket_weights, torch.Tensor) or bucket_weights.shape != (1 << nbits,):
        raise ValueError(f"bucket_weights must be [2**nbits={1 << nbits}]")
    return Q, squeeze


def is_integer(x) -> bool:
    return isinstance(x, torch.Tensor) and not (
        x.is_floating_point() or x.is_complex() or x.dtype == torch.bool
    )


def check_index(Q, codes, residuals, lengths, centroids, bucket_weights, names) -> None:
    """dtypes and device of the index tensors, named as the caller passed them (the fused kernel
    underneath calls them otherwise); ``ValueError`` like the other checks of this module.
    Offsets (``cu_seqlens_d``) are type-checked by ``check_offsets``."""
    codes_name, residuals_name, lengths_name = names
    if not is_integer(codes):
        raise ValueError(
            f"{codes_name} must be an integer tensor of centroid ids, got {kind_of(codes)}"
        )
    if not isinstance(residuals, torch.Tensor) or residuals.dtype != torch.uint8:
        raise ValueError(
            f"{residuals_name} must be a uint8 tensor of packed bucket indices, got {kind_of(residuals)}"
        )
    if lengths_name == "doc_lengths" and not is_integer(lengths):
        raise ValueError(f"doc_lengths must be an integer tensor, got {kind_of(lengths)}")
    check_devices(
        Q=Q, **{codes_name: codes, residuals_name: residuals, lengths_name: lengths},
        centroids=centroids, bucket_weights=bucket_weights,
    )  # fmt: skip


def kind_of(x) -> str:
    return f"{x.dtype} tensor" if isinstance(x, torch.Tensor) else type(x).__name__


def check_codes(name: str, valid_codes: torch.Tensor, n_centroids: int) -> None:
    """The codes of real tokens must index a centroid (padding may hold anything)."""
    if valid_codes.numel():
        lo, hi = torch.stack([valid_codes.min(), valid_codes.max()]).tolist()
        if lo < 0 or hi >= n_centroids:
            raise ValueError(
                f"{name} must index centroids, i.e. lie in [0, {n_centroids}); got values in "
                f"[{lo}, {hi}]"
            )
