"""Route Sentence Transformers' multi-vector (MaxSim) scoring through the fused kernels.

Patched (sentence-transformers >=6.2,<7): the two chunk scorers of
``sentence_transformers.util.similarity`` that every MaxSim path of the library ends in,
``_maxsim_score_documents`` (every query against every document) and ``_maxsim_score_pairs``
(query ``i`` against document ``i``). Through them the patch reaches ``maxsim``/``mean_maxsim``
(``MultiVectorEncoder.similarity``, the evaluators), ``maxsim_pairwise`` (``similarity_pairwise``)
and the ``colbert_*`` scoring functions that the multi-vector losses default to (multiple
negatives ranking, its cached variant, MarginMSE, KL distillation), forward and backward, without
touching the library's chunking, padding, length normalisation or empty-document handling.
``colbert_kd_scores`` (the distillation loss's scorer, which the library runs one candidate
column at a time) is replaced too, by one 4-D call, wherever a module bound it at import.
Build losses after patching: a loss object keeps the scorer it was built with.

A chunk runs the kernels when its tensors sit where the kernels run (CUDA, or CPU under
``TRITON_INTERPRET=1``) in one floating dtype other than float64; anything else keeps the
library's code. The library's mask rules are kept: a masked document token never wins the max, a
document without a valid token gets the library's sentinel score, and a float query mask weights
each query token's maximum (exactly so for the non-negative weights the library produces).
"""

from __future__ import annotations

import functools
import importlib
import sys

import torch

from ._patching import PatchSet, installed_version, logger, patching_disabled, routes_to_kernels
from ._scoring import kernels

MINIMUM_VERSION = "6.2"
BELOW_VERSION = "7"

_patches = PatchSet("sentence-transformers")
_SIMILARITY = "sentence_transformers.util.similarity"
_COLBERT = "sentence_transformers.multi_vector_encoder.scoring.colbert"
# modules that bind colbert_kd_scores at import time; imported before patching so that a later
# import cannot keep an unpatched copy
_DEPENDENT_MODULES = (
    "sentence_transformers.multi_vector_encoder.scoring",
    "sentence_transformers.multi_vector_encoder.losses.distill_kl_div",
)


def _routable(a: torch.Tensor, b: torch.Tensor, a_mask, b_mask) -> bool:
    if a.dim() != 3 or b.dim() != 3 or a.shape[1] == 0 or b.shape[1] == 0:
        return False  # zero-width chunks keep the library's own fill
    if a.dtype != b.dtype or a.shape[-1] != b.shape[-1]:
        return False
    for mask in (a_mask, b_mask):
        if mask is not None and (not isinstance(mask, torch.Tensor) or mask.device != a.device):
            return False
    return routes_to_kernels(a, b)


def _query_side(a: torch.Tensor, a_mask: torch.Tensor | None):
    """``(queries, bool mask)`` in the kernels' convention. A bool mask is passed through; a
    numeric one multiplies each token's maximum in the library, which for weights >= 0 equals
    scoring the query token scaled by its weight (a zero weight scores exactly 0)."""
    if a_mask is None or a_mask.dtype == torch.bool:
        return a, a_mask
    return a * a_mask.to(a.dtype).unsqueeze(-1), None


def _make_chunk_scorer(original, similarity, pairs: bool):
    """``_maxsim_score_documents`` (every query against every document) or, with ``pairs``,
    ``_maxsim_score_pairs`` (query ``i`` against document ``i``) on the fused kernels."""

    def scorer(a, b, a_mask, b_mask):
        if not _routable(a, b, a_mask, b_mask) or (pairs and a.shape[0] != b.shape[0]):
            return original(a, b, a_mask, b_mask)
        maxsim, maxsim_pairs = kernels()
        q, q_mask = _query_side(a, a_mask)
        d_mask = None if b_mask is None else b_mask.ne(0)
        scores = (maxsim_pairs if pairs else maxsim)(q, b, q_mask, d_mask)
        if d_mask is not None:
            scores = similarity._fill_empty_document_scores(scores, ~d_mask.any(dim=-1))
        return scores

    return functools.wraps(original)(scorer)


def _make_kd_scores(original, similarity):
    """``colbert_kd_scores`` (each query against its own ``n_ways`` candidates) in one 4-D
    ``maxsim`` call; the library scores the candidates one column at a time."""

    def colbert_kd_scores(
        queries_embeddings,
        documents_embeddings,
        queries_mask=None,
        documents_mask=None,
        chunk_elements=None,
        length_normalize=False,
    ):
        q, d = queries_embeddings, documents_embeddings
        if not (
            isinstance(q, torch.Tensor)
            and isinstance(d, torch.Tensor)
            and q.dim() == 3
            and d.dim() == 4
            and d.shape[0] == q.shape[0]
            and q.shape[0] > 0
            and d.shape[1] > 0
            and _routable(q, d[:, 0], queries_mask, None)
            and (documents_mask is None or documents_mask.device == q.device)
        ):
            return original(
                q, d, queries_mask, documents_mask,
                chunk_elements=chunk_elements, length_normalize=length_normalize,
            )  # fmt: skip
        maxsim, _ = kernels()
        # the library's masks: given, or all-zero token rows are padding
        a_mask = queries_mask if queries_mask is not None else q.ne(0).any(dim=-1).to(q.dtype)
        d_mask = documents_mask.ne(0) if documents_mask is not None else d.ne(0).any(dim=-1)
        queries, q_mask = _query_side(q, a_mask)
        scores = maxsim(queries, d, q_mask, d_mask)
        scores = similarity._fill_empty_document_scores(scores, ~d_mask.any(dim=-1))
        if length_normalize:
            counts = similarity._query_token_counts(q, queries_mask)
            scores = scores / counts.to(device=scores.device, dtype=scores.dtype).unsqueeze(1)
        return scores

    return functools.wraps(original)(colbert_kd_scores)


#: the library's chunk scorers, and whether each scores aligned pairs
_CHUNK_SCORERS = {"_maxsim_score_documents": False, "_maxsim_score_pairs": True}


def patch_sentence_transformers() -> bool:
    """Route Sentence Transformers' MaxSim scoring through the fused kernels (see the module
    docstring).

    Idempotent; undone exactly by :func:`unpatch_sentence_transformers`. Returns whether the patch
    is in place (``False`` when ``LATE_INTERACTION_KERNELS_DISABLE_PATCH=1``).

    Raises:
        ImportError: sentence-transformers is not installed.
        UnsupportedVersionError: the installed version is outside ``>=6.2,<7``.
    """
    if patching_disabled():
        logger.info(
            "late-interaction-kernels: Sentence Transformers patch disabled by the environment"
        )
        return False
    found = installed_version("sentence-transformers", minimum=MINIMUM_VERSION, below=BELOW_VERSION)
    if _patches.active:
        return True
    similarity = importlib.import_module(_SIMILARITY)
    colbert = importlib.import_module(_COLBERT)
    for name in _DEPENDENT_MODULES:
        importlib.import_module(name)
    try:
        for name, pairs in _CHUNK_SCORERS.items():
            scorer = _make_chunk_scorer(getattr(similarity, name), similarity, pairs)
            _patches.replace(similarity, name, scorer)
        # copies taken with ``from ... import colbert_kd_scores`` (the scoring package, the
        # distillation loss's default) are the same object: swap them all
        kd = colbert.colbert_kd_scores
        kd_fast = _make_kd_scores(kd, similarity)
        modules = [
            m for n, m in list(sys.modules.items()) if n.startswith("sentence_transformers") and m
        ]
        _patches.swap_module_globals(modules, {id(kd): kd}, lambda _: kd_fast)
        _patches.summary.append(
            "routed "
            + ", ".join(f"util.similarity.{n}" for n in _CHUNK_SCORERS)
            + ", colbert_kd_scores"
        )
    except Exception:
        _patches.restore()
        raise
    _patches.log("Sentence Transformers", found)
    return True


def unpatch_sentence_transformers() -> None:
    """Restore every object :func:`patch_sentence_transformers` replaced (a no-op when not
    patched)."""
    if _patches.active:
        _patches.restore()
        logger.info("late-interaction-kernels: Sentence Transformers unpatched")


def is_patched() -> bool:
    return _patches.active
