"""ColBERTv2's candidate-pruning score: one Triton program per document on CUDA, chunks of
gathered centroid scores in PyTorch elsewhere."""

from __future__ import annotations

import torch

from triton_dispatch import common_device, select_backend, uses_triton

from .kernels import launch_plaid_approx_score
from .reference import length_mask
from .validation import is_integer, kind_of


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
    if not is_integer(codes):
        raise ValueError(f"codes must be an integer tensor of centroid ids, got {kind_of(codes)}")
    if not is_integer(doc_lengths):
        raise ValueError(f"doc_lengths must be an integer tensor, got {kind_of(doc_lengths)}")
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
