"""colpali-engine drop-ins: :func:`patch_colpali_engine` / :func:`unpatch_colpali_engine` and
routed versions of what the patch touches, callable directly (colpali-engine must be installed).

The ``patched_colbert_*_forward(self, ...)`` functions run the loss's own ``forward`` with its
MaxSim terms on the fused kernels: when the patch is not in place they apply it for the duration
of the call (not thread-safe; call :func:`patch_colpali_engine` once instead in threaded code).
"""

from __future__ import annotations

import importlib

from .integrations import patch_colpali_engine, unpatch_colpali_engine

__all__ = [
    "patch_colpali_engine",
    "patched_colbert_loss_forward",
    "patched_colbert_negative_ce_forward",
    "patched_colbert_pairwise_ce_forward",
    "patched_colbert_pairwise_negative_ce_forward",
    "patched_colbert_sigmoid_forward",
    "patched_score_multi_vector",
    "unpatch_colpali_engine",
]


def patched_score_multi_vector(qs, ps, batch_size: int = 128, device=None):
    """``BaseVisualRetrieverProcessor.score_multi_vector`` on the fused kernels: ``(len(qs),
    len(ps))`` float32 on the CPU."""
    from .integrations import colpali

    processing = importlib.import_module("colpali_engine.utils.processing_utils")
    torch_utils = importlib.import_module("colpali_engine.utils.torch_utils")
    base = processing.BaseVisualRetrieverProcessor
    original = colpali.original_attribute(base, "score_multi_vector")
    original = getattr(original, "__func__", original)
    routed = colpali._make_score_multi_vector(original, torch_utils.get_torch_device)
    return routed(qs, ps, batch_size=batch_size, device=device)


def _forward(class_name: str, self, *args, **kwargs):
    from .integrations import colpali

    losses = importlib.import_module("colpali_engine.loss.late_interaction_losses")
    forward = colpali.original_attribute(getattr(losses, class_name), "forward")
    with colpali.routed():
        return forward(self, *args, **kwargs)


def patched_colbert_loss_forward(self, query_embeddings, doc_embeddings, offset: int = 0):
    """``ColbertLoss.forward`` with its score matrix on the fused kernels."""
    return _forward("ColbertLoss", self, query_embeddings, doc_embeddings, offset=offset)


def patched_colbert_pairwise_ce_forward(self, query_embeddings, doc_embeddings, offset: int = 0):
    """``ColbertPairwiseCELoss.forward`` on the fused kernels."""
    return _forward("ColbertPairwiseCELoss", self, query_embeddings, doc_embeddings, offset=offset)


def patched_colbert_sigmoid_forward(self, query_embeddings, doc_embeddings, offset: int = 0):
    """``ColbertSigmoidLoss.forward`` on the fused kernels."""
    return _forward("ColbertSigmoidLoss", self, query_embeddings, doc_embeddings, offset=offset)


def patched_colbert_negative_ce_forward(
    self, query_embeddings, doc_embeddings, neg_doc_embeddings, offset: int = 0
):
    """``ColbertNegativeCELoss.forward`` on the fused kernels."""
    return _forward(
        "ColbertNegativeCELoss", self, query_embeddings, doc_embeddings, neg_doc_embeddings,
        offset=offset,
    )  # fmt: skip


def patched_colbert_pairwise_negative_ce_forward(
    self, query_embeddings, doc_embeddings, neg_doc_embeddings, offset: int = 0
):
    """``ColbertPairwiseNegativeCELoss.forward`` on the fused kernels."""
    return _forward(
        "ColbertPairwiseNegativeCELoss", self, query_embeddings, doc_embeddings,
        neg_doc_embeddings, offset=offset,
    )  # fmt: skip
