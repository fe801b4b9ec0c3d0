"""PyLate drop-ins: :func:`patch_pylate` / :func:`unpatch_pylate` and the routed scoring
functions they install, callable directly (PyLate must be installed).

Each ``patched_*`` function runs the fused kernels where they run (CUDA, or CPU under the Triton
interpreter) and PyLate's own function elsewhere, with PyLate's mask rule (a masked document token
takes part with similarity 0). ``mask=`` is the older single-mask name of ``documents_mask``.
"""

from __future__ import annotations

import torch

from .integrations import patch_pylate, unpatch_pylate
from .integrations._scoring import as_bool_mask, kernels, zero_masked_tokens

__all__ = [
    "patch_pylate",
    "patched_colbert_kd_scores",
    "patched_colbert_scores",
    "patched_colbert_scores_pairwise",
    "unpatch_pylate",
]


def _routed(name: str):
    from .integrations.pylate import replacement

    return replacement(name)


def patched_colbert_scores(
    queries_embeddings, documents_embeddings, queries_mask=None, documents_mask=None, *, mask=None
):
    """:func:`pylate.scores.colbert_scores` on the fused kernels: ``(Nq, Nd)``."""
    documents_mask = mask if documents_mask is None else documents_mask
    return _routed("colbert_scores")(
        queries_embeddings, documents_embeddings, queries_mask, documents_mask
    )


def patched_colbert_kd_scores(
    queries_embeddings, documents_embeddings, queries_mask=None, documents_mask=None, *, mask=None
):
    """:func:`pylate.scores.colbert_kd_scores` on the fused kernels: documents
    ``(Nq, K, Ld, d)``, scores ``(Nq, K)``."""
    documents_mask = mask if documents_mask is None else documents_mask
    return _routed("colbert_kd_scores")(
        queries_embeddings, documents_embeddings, queries_mask, documents_mask
    )


def patched_colbert_scores_pairwise(
    queries_embeddings, documents_embeddings, queries_mask=None, documents_mask=None, *, mask=None
):
    """:func:`pylate.scores.colbert_scores_pairwise` on the fused kernels: query ``i`` against
    document ``i``. With masks (which PyLate's own function does not take) the pairs are scored
    by :func:`late_interaction_kernels.maxsim_pairs` on any device."""
    documents_mask = mask if documents_mask is None else documents_mask
    if queries_mask is None and documents_mask is None:
        return _routed("colbert_scores_pairwise")(queries_embeddings, documents_embeddings)
    q, d = torch.as_tensor(queries_embeddings), torch.as_tensor(documents_embeddings)
    _, maxsim_pairs = kernels()
    scores = maxsim_pairs(q, zero_masked_tokens(d, documents_mask), as_bool_mask(queries_mask))
    return scores.to(torch.promote_types(q.dtype, d.dtype))
