"""The PLAID index layout of the ``late_interaction_kernels.plaid`` functions, in plain PyTorch:
their specification and the oracle of their tests.

A document is ``doc_lengths[n]`` tokens; token ``t`` is stored as a centroid id ``codes[n, t]``
and ``d`` bucket indices of ``nbits`` bits packed into ``ceil(d * nbits / 8)`` bytes:
dimension ``f`` sits in byte ``f // (8 // nbits)`` at bit offset ``(f % (8 // nbits)) * nbits``
(least significant first). The token is ``centroids[code] + bucket_weights[index]``, L2-normalised
together with the queries when ``normalize=True``.

(``ops.maxsim_residual`` reads ColBERTv2's ``packbits`` order instead, which is the same bytes
with the bits of each byte reversed.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")


def unpack_residuals_reference(residuals: torch.Tensor, nbits: int, d: int) -> torch.Tensor:
    """``(..., ceil(d * nbits / 8))`` uint8 → bucket indices ``(..., d)`` int32."""
    per_byte = 8 // nbits
    f = torch.arange(d, device=residuals.device)
    shifts = ((f % per_byte) * nbits).to(torch.int32)
    raw = residuals.to(torch.int32)[..., f // per_byte]
    return (raw >> shifts) & ((1 << nbits) - 1)


def decompress_padded(codes, residuals, centroids, bucket_weights, nbits: int, d: int):
    """Token embeddings ``(Nd, max_Ld, d)`` float32 of a padded index (not normalised)."""
    idx = unpack_residuals_reference(residuals, nbits, d).long()
    return centroids.float()[codes.long()] + bucket_weights.float()[idx]


def length_mask(doc_lengths: torch.Tensor, width: int) -> torch.Tensor:
    return torch.arange(width, device=doc_lengths.device) < doc_lengths.unsqueeze(-1)


def _masked_maxsim(S: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``S (Nq, Nd, Lq, Ld)`` → ``(Nq, Nd)``: masked tokens never win, empty documents give 0."""
    m = S.masked_fill(~mask[None, :, None, :], NEG_INF).max(dim=-1).values
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m)).sum(dim=-1)


def maxsim_residual_reference(
    Q: torch.Tensor,
    codes: torch.Tensor,
    residuals: torch.Tensor,
    doc_lengths: torch.Tensor,
    centroids: torch.Tensor,
    bucket_weights: torch.Tensor,
    nbits: int,
    *,
    normalize: bool = True,
) -> torch.Tensor:
    """MaxSim of ``Q (Nq, Lq, d)`` (or ``(Lq, d)``) against a padded index: ``(Nq, Nd)``."""
    squeeze = Q.dim() == 2
    Q = Q.unsqueeze(0) if squeeze else Q
    dtype = torch.float64 if Q.dtype == torch.float64 else torch.float32
    emb = decompress_padded(codes, residuals, centroids, bucket_weights, nbits, Q.shape[-1])
    emb, Qf = emb.to(dtype), Q.to(dtype)
    if normalize:
        emb, Qf = F.normalize(emb, dim=-1), F.normalize(Qf, dim=-1)
    S = torch.einsum("ild,jtd->ijlt", Qf, emb)
    out = _masked_maxsim(S, length_mask(doc_lengths.to(codes.device), codes.shape[1]))
    return out.squeeze(0) if squeeze else out


def plaid_approx_score_reference(
    query_centroid_scores: torch.Tensor, codes: torch.Tensor, doc_lengths: torch.Tensor
) -> torch.Tensor:
    """ColBERTv2's candidate-pruning score: for each query token the best centroid score among a
    document's token codes, summed. ``(n_centroids, Lq)``, ``(B, max_Ld)``, ``(B,)`` → ``(B,)``."""
    qcs = query_centroid_scores.float()
    gathered = qcs[codes.long()]  # (B, max_Ld, Lq)
    mask = length_mask(doc_lengths.to(codes.device), codes.shape[1])
    m = gathered.masked_fill(~mask[..., None], NEG_INF).max(dim=1).values
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m)).sum(dim=-1)


def plaid_approx_score_chunked(
    query_centroid_scores: torch.Tensor, codes: torch.Tensor, doc_lengths: torch.Tensor
) -> torch.Tensor:
    """:func:`plaid_approx_score_reference` with the published op's rule for codes outside
    ``[0, n_centroids)`` (they read centroid 0), gathering a chunk of documents at a time so that
    memory stays bounded: the PyTorch route of ``plaid_approx_score``."""
    qcs = query_centroid_scores.float()
    n_centroids, lq = qcs.shape
    codes = codes.long()
    codes = torch.where((codes >= 0) & (codes < n_centroids), codes, torch.zeros_like(codes))
    out = []
    step = max(1, (1 << 24) // max(codes.shape[1] * lq, 1))
    for start in range(0, codes.shape[0], step):
        sl = slice(start, start + step)
        out.append(plaid_approx_score_reference(qcs, codes[sl], doc_lengths[sl]))
    return torch.cat(out) if out else qcs.new_zeros(0)
