"""PLAID / ColBERTv2 residual compression in plain PyTorch: the specification of
``maxsim_residual`` and the oracle of its tests.

A document token is stored as the id of its nearest centroid plus, for each of the ``d``
dimensions, an ``nbits``-bit bucket index into ``bucket_weights`` (the residual's quantised
value). The bucket indices are packed in the layout ColBERTv2's ``ResidualCodec.binarize``
writes: the bits of dimension ``j`` sit at bit positions ``j * nbits + k`` (``k = 0`` the least
significant bit of the index), and bit position ``p`` is bit ``7 - p % 8`` of byte ``p // 8``
(``numpy.packbits`` order). Decompression is ``normalize(centroids[code] + bucket_weights[idx])``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..maxsim.reference import maxsim_reference


def unpack_buckets(packed: torch.Tensor, nbits: int, dim: int) -> torch.Tensor:
    """``(N, dim * nbits / 8)`` uint8 -> bucket indices ``(N, dim)`` int64."""
    shifts = torch.arange(7, -1, -1, device=packed.device)
    bits = (packed.long().unsqueeze(-1) >> shifts) & 1  # (N, bytes, 8), MSB first
    bits = bits.reshape(packed.shape[0], dim, nbits)
    weights = 1 << torch.arange(nbits, device=packed.device)
    return (bits * weights).sum(dim=-1)


def pack_buckets(indices: torch.Tensor, nbits: int) -> torch.Tensor:
    """Inverse of :func:`unpack_buckets` (used to build test collections)."""
    n, dim = indices.shape
    bits = (indices.long().unsqueeze(-1) >> torch.arange(nbits, device=indices.device)) & 1
    bits = bits.reshape(n, dim * nbits // 8, 8)
    weights = 1 << torch.arange(7, -1, -1, device=indices.device)
    return (bits * weights).sum(dim=-1).to(torch.uint8)


def decompress(
    centroids: torch.Tensor,
    codes: torch.Tensor,
    packed_residuals: torch.Tensor,
    bucket_weights: torch.Tensor,
    nbits: int,
) -> torch.Tensor:
    """Token embeddings ``(N, d)`` of the compressed tokens, L2-normalised."""
    idx = unpack_buckets(packed_residuals, nbits, centroids.shape[1])
    return F.normalize(centroids[codes.long()] + bucket_weights[idx], dim=-1)


def maxsim_residual_reference(
    Q: torch.Tensor,
    centroids: torch.Tensor,
    codes: torch.Tensor,
    packed_residuals: torch.Tensor,
    bucket_weights: torch.Tensor,
    doclens: torch.Tensor,
    *,
    nbits: int,
    q_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(Nq, Nd)`` MaxSim of ``Q`` against the decompressed documents (``doclens`` tokens
    each, concatenated in order); a zero-length document scores 0."""
    tokens = decompress(centroids, codes, packed_residuals, bucket_weights, nbits).to(Q.dtype)
    docs = list(torch.split(tokens, doclens.tolist()))
    width = max([int(n) for n in doclens.tolist()] + [1])
    D = tokens.new_zeros(len(docs), width, tokens.shape[1])
    mask = torch.zeros(len(docs), width, dtype=torch.bool, device=tokens.device)
    for i, doc in enumerate(docs):
        D[i, : doc.shape[0]] = doc
        mask[i, : doc.shape[0]] = True
    return maxsim_reference(Q, D, q_mask, mask)
