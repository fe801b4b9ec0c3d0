"""PLAID / ColBERTv2 scoring on the index layout of :mod:`.reference` (padded or ragged), on
top of the fused residual kernel of :mod:`..maxsim_residual`.

With ``normalize=True`` (the PLAID convention) the fused kernel decompresses and scores each
document tile in registers; the layout differs from the kernel's only in the bit order within a
byte, which one table lookup over the packed bytes converts (the collection is never
decompressed). ``normalize=False`` decompresses a chunk of documents at a time and scores it with
:func:`maxsim`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from triton_dispatch import common_device, select_backend, uses_triton

from ..maxsim import maxsim_unchecked
from ..maxsim_residual import maxsim_residual as _fused_residual
from ..maxsim_residual import maxsim_residual_prechecked
from ..varlen.layout import check_devices, check_offsets, loop_bound, pad
from .kernels import launch_plaid_approx_score
from .reference import decompress_padded, length_mask

__all__ = ["maxsim_residual", "maxsim_residual_varlen", "plaid_approx_score"]

#: Documents decompressed at a time on the ``normalize=False`` path.
CHUNK_DOCS = 1024

_BIT_REVERSED = torch.tensor([int(f"{i:08b}"[::-1], 2) for i in range(256)], dtype=torch.uint8)


def _check_common(Q, residuals, centroids, bucket_weights, nbits) -> tuple[torch.Tensor, bool]:
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


def _is_integer(x) -> bool:
    return isinstance(x, torch.Tensor) and not (
        x.is_floating_point() or x.is_complex() or x.dtype == torch.bool
    )


def _check_index(Q, codes, residuals, lengths, centroids, bucket_weights, names) -> None:
    """dtypes and device of the index tensors, named as the caller passed them (the fused kernel
    underneath calls them otherwise); ``ValueError`` like the other checks of this module.
    Offsets (``cu_seqlens_d``) are type-checked by ``check_offsets``."""
    codes_name, residuals_name, lengths_name = names
    if not _is_integer(codes):
        raise ValueError(
            f"{codes_name} must be an integer tensor of centroid ids, got {_kind(codes)}"
        )
    if not isinstance(residuals, torch.Tensor) or residuals.dtype != torch.uint8:
        raise ValueError(
            f"{residuals_name} must be a uint8 tensor of packed bucket indices, got {_kind(residuals)}"
        )
    if lengths_name == "doc_lengths" and not _is_integer(lengths):
        raise ValueError(f"doc_lengths must be an integer tensor, got {_kind(lengths)}")
    check_devices(
        Q=Q, **{codes_name: codes, residuals_name: residuals, lengths_name: lengths},
        centroids=centroids, bucket_weights=bucket_weights,
    )  # fmt: skip


def _kind(x) -> str:
    return f"{x.dtype} tensor" if isinstance(x, torch.Tensor) else type(x).__name__


def _check_codes(name: str, valid_codes: torch.Tensor, n_centroids: int) -> None:
    """The codes of real tokens must index a centroid (padding may hold anything)."""
    if valid_codes.numel():
        lo, hi = torch.stack([valid_codes.min(), valid_codes.max()]).tolist()
        if lo < 0 or hi >= n_centroids:
            raise ValueError(
                f"{name} must index centroids, i.e. lie in [0, {n_centroids}); got values in "
                f"[{lo}, {hi}]"
            )


def _fused(Q, codes_flat, residuals_flat, lengths, centroids, bucket_weights, nbits, q_mask,
           backend):  # fmt: skip
    packed = _BIT_REVERSED.to(residuals_flat.device)[residuals_flat.to(torch.uint8).long()]
    # the wrappers checked the codes and lengths already; with gradients the op still checks
    # (a zero-length document has no gradient)
    score = (
        _fused_residual
        if Q.requires_grad and torch.is_grad_enabled()
        else maxsim_residual_prechecked
    )
    return score(
        F.normalize(Q, dim=-1), centroids, codes_flat, packed, bucket_weights.float(), lengths,
        nbits=nbits, q_mask=q_mask, backend=backend,
    )  # fmt: skip


def _unnormalized(Q, codes, residuals, lengths, centroids, bucket_weights, nbits, q_mask,
                  backend):  # fmt: skip
    blocks = []
    for start in range(0, codes.shape[0], CHUNK_DOCS):
        sl = slice(start, start + CHUNK_DOCS)
        emb = decompress_padded(codes[sl], residuals[sl], centroids, bucket_weights, nbits,
                                Q.shape[-1]).to(Q.dtype)  # fmt: skip
        mask = length_mask(lengths[sl], codes.shape[1])
        blocks.append(maxsim_unchecked(Q, emb, q_mask, mask, backend=backend))
    if not blocks:
        return Q.new_zeros(Q.shape[0], 0, dtype=torch.float32)
    return torch.cat(blocks, dim=1)


def maxsim_residual(
    Q: torch.Tensor,
    codes: torch.Tensor,
    residuals: torch.Tensor,
    doc_lengths: torch.Tensor,
    centroids: torch.Tensor,
    bucket_weights: torch.Tensor,
    nbits: int,
    *,
    normalize: bool = True,
    q_mask: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """MaxSim of ``Q`` against a padded PLAID index, decompressed in registers.

    Args:
        Q: ``(Nq, Lq, d)`` or ``(Lq, d)`` queries.
        codes: ``(Nd, max_Ld)`` integer centroid ids.
        residuals: ``(Nd, max_Ld, d * nbits / 8)`` uint8 packed bucket indices.
        doc_lengths: ``(Nd,)`` valid tokens per document.
        centroids: ``(n_centroids, d)``; bucket_weights: ``(2 ** nbits,)``.
        nbits: 2, 4 or 8.
        normalize: L2-normalise the queries and the decompressed tokens.
        q_mask: bool ``(Nq, Lq)`` (an addition): masked query tokens add 0.
        backend: ``"triton"``, ``"interpret"`` or ``"torch"`` (default: by device).

    Returns:
        float32 ``(Nq, Nd)`` (``(Nd,)`` for a 2-D ``Q``), differentiable in ``Q``. An empty
        document scores 0 and raises ``ValueError`` when ``Q`` requires grad.
    """
    Q, squeeze = _check_common(Q, residuals, centroids, bucket_weights, nbits)
    names = ("codes", "residuals", "doc_lengths")
    _check_index(Q, codes, residuals, doc_lengths, centroids, bucket_weights, names)
    if codes.dim() != 2:
        raise ValueError("codes must be [Nd, max_Ld]")
    if residuals.dim() != 3 or residuals.shape[:2] != codes.shape:
        raise ValueError("residuals must be [Nd, max_Ld, packed_dim] matching codes")
    if doc_lengths.dim() != 1 or doc_lengths.shape[0] != codes.shape[0]:
        raise ValueError("doc_lengths must be [Nd] with Nd matching codes")
    lengths = doc_lengths.to(device=codes.device, dtype=torch.int64)
    if lengths.numel():
        shortest, longest = torch.stack([lengths.min(), lengths.max()]).tolist()
        if shortest < 0 or longest > codes.shape[1]:
            raise ValueError(
                f"doc_lengths must lie in [0, max_Ld={codes.shape[1]}]; got values in "
                f"[{shortest}, {longest}]"
            )
    mask = length_mask(lengths, codes.shape[1])
    _check_codes("codes", codes[mask], centroids.shape[0])
    if normalize:
        out = _fused(Q, codes[mask], residuals[mask], lengths, centroids, bucket_weights, nbits,
                     q_mask, backend)  # fmt: skip
    else:
        out = _unnormalized(Q, codes, residuals, lengths, centroids, bucket_weights, nbits,
                            q_mask, backend)  # fmt: skip
    return out.squeeze(0) if squeeze else out


def maxsim_residual_varlen(
    Q: torch.Tensor,
    codes_flat: torch.Tensor,
    residuals_flat: torch.Tensor,
    cu_seqlens_d: torch.Tensor,
    centroids: torch.Tensor,
    bucket_weights: torch.Tensor,
    nbits: int,
    *,
    max_seqlen_d: int | None = None,
    normalize: bool = True,
    q_mask: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """:func:`maxsim_residual` on the ragged on-disk layout: ``codes_flat (total,)``,
    ``residuals_flat (total, d * nbits / 8)``, documents delimited by ``cu_seqlens_d (Nd + 1,)``.

    ``max_seqlen_d`` is the longest document (read from the offsets when omitted; a smaller
    value raises ``ValueError``). Returns float32 ``(Nq, Nd)`` (``(Nd,)`` for a 2-D ``Q``).
    """
    Q, squeeze = _check_common(Q, residuals_flat, centroids, bucket_weights, nbits)
    names = ("codes_flat", "residuals_flat", "cu_seqlens_d")
    _check_index(Q, codes_flat, residuals_flat, cu_seqlens_d, centroids, bucket_weights, names)
    if codes_flat.dim() != 1:
        raise ValueError("codes_flat must be 1-D [total_d_tokens]")
    if residuals_flat.dim() != 2 or residuals_flat.shape[0] != codes_flat.shape[0]:
        raise ValueError("residuals_flat must be 2-D [total_d_tokens, packed_dim]")
    if not isinstance(cu_seqlens_d, torch.Tensor) or cu_seqlens_d.dim() != 1:
        raise ValueError("cu_seqlens_d must be 1-D [Nd + 1]")
    lengths = check_offsets("cu_seqlens_d", cu_seqlens_d, codes_flat.shape[0])
    width = loop_bound("max_seqlen_d", max_seqlen_d, lengths)
    lo, hi = int(cu_seqlens_d[0]), int(cu_seqlens_d[-1])
    _check_codes("codes_flat", codes_flat[lo:hi], centroids.shape[0])
    if normalize:
        out = _fused(Q, codes_flat[lo:hi], residuals_flat[lo:hi], lengths, centroids,
                     bucket_weights, nbits, q_mask, backend)  # fmt: skip
    else:
        codes, _ = pad(codes_flat[:, None], cu_seqlens_d, lengths, width)
        residuals, _ = pad(residuals_flat, cu_seqlens_d, lengths, width)
        out = _unnormalized(Q, codes[..., 0], residuals, lengths, centroids, bucket_weights,
                            nbits, q_mask, backend)  # fmt: skip
    return out.squeeze(0) if squeeze else out


def plaid_approx_score(
    query_centroid_scores: torch.Tensor,
    codes: torch.Tensor,
    doc_lengths: torch.Tensor,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """ColBERTv2's candidate-pruning score, ``(B,)`` float32: per query token the best
    ``query_centroid_scores[code]`` among a document's first ``doc_lengths[b]`` codes, summed.

    ``query_centroid_scores``: ``(n_centroids, Lq)`` (``centroids @ Q.T``); ``codes``:
    ``(B, max_Ld)``; ``doc_lengths``: ``(B,)``. As published: codes outside ``[0, n_centroids)``
    read centroid 0, and a query token whose best score is not finite (NaN, ±inf, or no token in
    the document) adds 0. On CUDA one Triton program per document keeps a running maximum per query
    token (:mod:`.kernels`); the PyTorch path gathers documents in chunks, so memory stays bounded.
    ``backend``: ``"triton"``, ``"interpret"`` or ``"torch"`` (default: by device).
    """
    if not isinstance(query_centroid_scores, torch.Tensor) or query_centroid_scores.dim() != 2:
        raise ValueError("query_centroid_scores must be [n_centroids, Lq]")
    if not isinstance(codes, torch.Tensor) or codes.dim() != 2:
        raise ValueError("codes must be [B, max_Ld]")
    if (
        not isinstance(doc_lengths, torch.Tensor)
        or doc_lengths.dim() != 1
        or doc_lengths.shape[0] != codes.shape[0]
    ):
        raise ValueError("doc_lengths must be [B] with B matching codes")
    if not _is_integer(codes):
        raise ValueError(f"codes must be an integer tensor of centroid ids, got {_kind(codes)}")
    if not _is_integer(doc_lengths):
        raise ValueError(f"doc_lengths must be an integer tensor, got {_kind(doc_lengths)}")
    device = common_device(
        [query_centroid_scores, codes, doc_lengths],
        names=["query_centroid_scores", "codes", "doc_lengths"],
    )
    if query_centroid_scores.shape[0] == 0 and codes.numel():
        raise ValueError(
            "query_centroid_scores must hold at least one centroid row (out-of-range codes read "
            "centroid 0), got shape (0, Lq)"
        )
    chosen = select_backend(device=device, backend=backend)
    if uses_triton(chosen) and query_centroid_scores.dtype != torch.float64:
        out = torch.empty(codes.shape[0], dtype=torch.float32, device=codes.device)
        if codes.shape[0]:
            launch_plaid_approx_score(
                query_centroid_scores.contiguous(),
                codes.contiguous(),
                doc_lengths.contiguous(),
                out,
            )
        return out
    qcs = query_centroid_scores.float()
    n_centroids, lq = qcs.shape
    codes = codes.long()
    codes = torch.where((codes >= 0) & (codes < n_centroids), codes, torch.zeros_like(codes))
    lengths = doc_lengths.to(codes.device)
    out = []
    step = max(1, (1 << 24) // max(codes.shape[1] * lq, 1))
    for start in range(0, codes.shape[0], step):
        sl = slice(start, start + step)
        gathered = qcs[codes[sl]]  # (b, max_Ld, Lq)
        mask = length_mask(lengths[sl], codes.shape[1])
        m = gathered.masked_fill(~mask[..., None], float("-inf")).amax(dim=1)
        out.append(torch.where(torch.isfinite(m), m, torch.zeros_like(m)).sum(dim=-1))
    return torch.cat(out) if out else qcs.new_zeros(0)
