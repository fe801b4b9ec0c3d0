"""The compressed index's token layout and its scores, in plain PyTorch: the specification of the
kernels of this folder and the oracle of their tests.

A collection of ``T`` tokens of width ``d`` in ``N`` documents:

* ``doc_offsets`` int64 ``(N + 1,)``: document ``n`` is tokens ``doc_offsets[n]:doc_offsets[n+1]``;
* ``codes`` int32 ``(T,)``: each token's centroid, a row of ``centroids`` ``(K, d)``;
* ``residuals`` uint8 ``(T, d * nbits / 8)``: per dimension ``f`` a bucket index of ``nbits``
  bits, in byte ``f // (8 // nbits)`` at bit offset ``(f % (8 // nbits)) * nbits`` (least
  significant first);
* ``bucket_weights`` float32 ``(d, 2 ** nbits)``: the value each bucket stands for, per dimension.

Token ``t`` decompresses to ``centroids[codes[t]] + bucket_weights[f, bucket[t, f]]`` for every
dimension ``f``. Scores are MaxSim: for a query ``(Lq, d)`` and a document, the sum over query
tokens of the best dot product with any of the document's tokens. Masked query tokens are
zero rows (they add 0); a document without tokens scores 0.

Search scores *pairs* ``(pair_query[p], pair_doc[p])``: each query against its own candidates,
never the whole collection.
"""

from __future__ import annotations

import torch

from ..plaid.reference import unpack_residuals_reference


def unpack_buckets(residuals: torch.Tensor, nbits: int, d: int) -> torch.Tensor:
    """``(..., d * nbits / 8)`` uint8 → bucket indices ``(..., d)`` int64 (the PLAID layout's
    order, :func:`..plaid.reference.unpack_residuals_reference`)."""
    return unpack_residuals_reference(residuals, nbits, d).long()


def pack_buckets(buckets: torch.Tensor, nbits: int) -> torch.Tensor:
    """Bucket indices ``(..., d)`` → ``(..., d * nbits / 8)`` uint8 (the inverse of
    :func:`unpack_buckets`)."""
    per_byte = 8 // nbits
    *lead, d = buckets.shape
    grouped = buckets.to(torch.int32).reshape(*lead, d // per_byte, per_byte)
    shifts = torch.arange(per_byte, device=buckets.device, dtype=torch.int32) * nbits
    return (grouped << shifts).sum(-1).to(torch.uint8)


def decompress_reference(codes, residuals, centroids, bucket_weights, nbits: int) -> torch.Tensor:
    """Tokens ``(T, d)`` float64 of a compressed collection."""
    d = centroids.shape[1]
    buckets = unpack_buckets(residuals, nbits, d)
    w = bucket_weights.double().gather(1, buckets.T).T if buckets.numel() else buckets.double()
    return centroids.double()[codes.long()] + w


def _pair_maxsim(Q64: torch.Tensor, pair_query, pair_doc, tokens64, doc_offsets) -> torch.Tensor:
    out = torch.zeros(pair_query.shape[0], dtype=torch.float64, device=Q64.device)
    for p, (qi, doc) in enumerate(zip(pair_query.tolist(), pair_doc.tolist())):
        lo, hi = int(doc_offsets[doc]), int(doc_offsets[doc + 1])
        if hi > lo:
            out[p] = (Q64[qi] @ tokens64[lo:hi].T).max(1).values.sum()
    return out


def token_pair_scores_reference(Q, pair_query, pair_doc, tokens, doc_offsets) -> torch.Tensor:
    """MaxSim of query ``pair_query[p]`` (``Q (Nq, Lq, d)``, masked tokens zeroed) against
    document ``pair_doc[p]`` of the uncompressed ``tokens (T, d)``: float64 ``(P,)``."""
    return _pair_maxsim(Q.double(), pair_query, pair_doc, tokens.double(), doc_offsets)


def residual_pair_scores_reference(
    Q, pair_query, pair_doc, codes, residuals, doc_offsets, centroids, bucket_weights, nbits: int
) -> torch.Tensor:
    """:func:`token_pair_scores_reference` against the decompressed tokens."""
    tokens = decompress_reference(codes, residuals, centroids, bucket_weights, nbits)
    return _pair_maxsim(Q.double(), pair_query, pair_doc, tokens, doc_offsets)


def centroid_pair_scores_reference(
    query_centroid_scores, pair_query, pair_doc, codes, doc_offsets
) -> torch.Tensor:
    """The candidate score (PLAID's centroid interaction): MaxSim against the document's tokens
    replaced by their centroids, from ``query_centroid_scores (Nq, K, Lq)`` (``centroids @ Q[i].T``
    per query). float64 ``(P,)``."""
    qcs = query_centroid_scores.double()
    out = torch.zeros(pair_query.shape[0], dtype=torch.float64, device=qcs.device)
    for p, (qi, doc) in enumerate(zip(pair_query.tolist(), pair_doc.tolist())):
        lo, hi = int(doc_offsets[doc]), int(doc_offsets[doc + 1])
        if hi > lo:
            out[p] = qcs[qi][codes[lo:hi].long()].max(0).values.sum()
    return out
