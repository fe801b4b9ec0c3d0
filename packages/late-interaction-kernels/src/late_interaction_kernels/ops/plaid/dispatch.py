"""PLAID scoring on the padded and ragged index layouts: the fused residual kernel with
``normalize=True``, chunks of decompressed documents through :func:`maxsim` otherwise; and the
candidate-pruning score through its declaration (:mod:`.op`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common.packed import check_offsets, loop_bound, pad
from ..maxsim import maxsim_unchecked
from ..maxsim_residual import maxsim_residual as _fused_residual
from ..maxsim_residual import maxsim_residual_prechecked
from .op import APPROX_SCORE
from .reference import decompress_padded, length_mask
from .validation import check_codes, check_common, check_index

#: Documents decompressed at a time on the ``normalize=False`` path.
CHUNK_DOCS = 1024

_BIT_REVERSED = torch.tensor([int(f"{i:08b}"[::-1], 2) for i in range(256)], dtype=torch.uint8)


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
        document scores 0; when ``Q`` requires grad, ``normalize=True`` (the fused kernel, which
        has no winner to send a gradient to) raises ``ValueError``, and ``normalize=False``
        passes it exactly zero gradient.
    """
    Q, squeeze = check_common(Q, residuals, centroids, bucket_weights, nbits)
    names = ("codes", "residuals", "doc_lengths")
    check_index(Q, codes, residuals, doc_lengths, centroids, bucket_weights, names)
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
    check_codes("codes", codes[mask], centroids.shape[0])
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
    Q, squeeze = check_common(Q, residuals_flat, centroids, bucket_weights, nbits)
    names = ("codes_flat", "residuals_flat", "cu_seqlens_d")
    check_index(Q, codes_flat, residuals_flat, cu_seqlens_d, centroids, bucket_weights, names)
    if codes_flat.dim() != 1:
        raise ValueError("codes_flat must be 1-D [total_d_tokens]")
    if residuals_flat.dim() != 2 or residuals_flat.shape[0] != codes_flat.shape[0]:
        raise ValueError("residuals_flat must be 2-D [total_d_tokens, packed_dim]")
    if not isinstance(cu_seqlens_d, torch.Tensor) or cu_seqlens_d.dim() != 1:
        raise ValueError("cu_seqlens_d must be 1-D [Nd + 1]")
    lengths = check_offsets("cu_seqlens_d", cu_seqlens_d, codes_flat.shape[0])
    width = loop_bound("max_seqlen_d", max_seqlen_d, lengths)
    lo, hi = int(cu_seqlens_d[0]), int(cu_seqlens_d[-1])
    check_codes("codes_flat", codes_flat[lo:hi], centroids.shape[0])
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
    return APPROX_SCORE(query_centroid_scores, codes, doc_lengths, backend=backend)
