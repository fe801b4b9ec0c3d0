"""Route PyLate's ColBERT scoring through the fused MaxSim kernels.

Patched (PyLate >=1.5.1,<2): ``pylate.scores.colbert_scores``, ``colbert_kd_scores`` and
``colbert_scores_pairwise`` in ``pylate.scores.colbert`` and in every already-imported ``pylate``
module that copied them with ``from ..scores import ...`` (rank, evaluators, losses,
``SimilarityFunction``), default arguments that captured them when a class was created
(``Distillation(score_metric=colbert_kd_scores)``, and older losses' ``score_metric`` defaults),
and ``ColBERTScores.__call__``, which then scores all document groups in one call instead of one
call per group.

Each patched function takes the ``backend=`` keyword of PyLate's own dispatcher and reads
``PYLATE_SCORES_BACKEND`` the same way: ``"torch"`` and ``"flash"`` keep PyLate's code;
``"auto"`` (default) and ``"lik"`` run the fused kernels when the tensors are on a device where
they run (CUDA, or CPU under ``TRITON_INTERPRET=1``) and PyLate's code otherwise.

PyLate's mask rule is kept: a masked query token adds 0, a masked document token takes part in
the max with similarity 0 (PyLate multiplies the similarities by the mask), so the scores equal
the original ones.

With ``gather_across_devices=True`` in a process group of several ranks and
``LATE_INTERACTION_KERNELS_CROSS_RANK=1``, ``Contrastive.forward`` and
``CachedContrastive.calculate_loss`` (PyLate gathers the documents with
``all_gather_with_gradients`` there and scores the gathered batch) score through
:func:`~late_interaction_kernels.maxsim_across_ranks` instead: the same loss and gradients. The
route is opt-in: at PyLate's shape on two GPUs it measures level with PyLate's own gather followed
by the patched (fused) scoring, which is what runs by default (PyLate pads each rank's documents to
its own longest, so the call takes the size exchange that ``uniform=True`` would skip). Both score all
queries in one call (``score_mini_batch_size`` only bounds the einsum intermediates the fused
kernels never build). Custom ``score_metric`` objects keep PyLate's code.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any

import torch

from ._patching import (
    PatchSet,
    installed_version,
    logger,
    patching_disabled,
    routes_to_kernels,
)
from ._scoring import as_bool_mask, kernels, zero_masked_tokens

MINIMUM_VERSION = "1.5.1"
BELOW_VERSION = "2"

_patches = PatchSet("pylate")

#: Opt-in switch of the cross-rank route of the gathering losses (see the module docstring).
CROSS_RANK_ENV_VAR = "LATE_INTERACTION_KERNELS_CROSS_RANK"

# modules that bind the scoring functions at import time; imported before patching so that a
# later import cannot keep an unpatched copy
_DEPENDENT_MODULES = (
    "pylate.scores",
    "pylate.scores.similarity_functions",
    "pylate.rank.rank",
    "pylate.losses",
    "pylate.losses.contrastive",
    "pylate.losses.cached_contrastive",
    "pylate.losses.distillation",
    "pylate.evaluation.colbert_distillation",
    "pylate.evaluation.colbert_triplet",
)


def _wants_kernels(backend: str | None, *tensors: Any, masks: tuple[Any, ...] = ()) -> bool:
    requested = backend if backend is not None else os.environ.get("PYLATE_SCORES_BACKEND", "auto")
    if not isinstance(requested, str) or requested.lower() not in ("auto", "lik"):
        return False  # "torch", "flash", or a bad value that PyLate itself reports
    if not all(isinstance(t, torch.Tensor) and t.numel() > 0 for t in tensors):
        return False
    for mask in masks:
        if mask is not None and (
            not isinstance(mask, torch.Tensor) or mask.device != tensors[0].device
        ):
            return False
    return routes_to_kernels(*tensors)


def _backend_kwargs(backend: str | None) -> dict[str, Any]:
    # PyLate's own functions read PYLATE_SCORES_BACKEND when no backend is passed
    return {} if backend is None else {"backend": backend}


def _same_dtype(scores: torch.Tensor, *like: torch.Tensor) -> torch.Tensor:
    return scores.to(torch.promote_types(like[0].dtype, like[1].dtype))


def _make_maxsim_scores(original, doc_rank: int):
    """``colbert_scores`` (documents ``(Nd, Ld, d)``, ``doc_rank=3``) or ``colbert_kd_scores``
    (each query's own documents ``(Nq, K, Ld, d)``, ``doc_rank=4``) on :func:`maxsim`."""

    def scores_fn(
        queries_embeddings,
        documents_embeddings,
        queries_mask=None,
        documents_mask=None,
        backend: str | None = None,
    ):
        q, d = queries_embeddings, documents_embeddings
        masks = (queries_mask, documents_mask)
        if not _wants_kernels(backend, q, d, masks=masks) or q.dim() != 3 or d.dim() != doc_rank:
            return original(q, d, queries_mask, documents_mask, **_backend_kwargs(backend))
        maxsim, _ = kernels()
        scores = maxsim(q, zero_masked_tokens(d, documents_mask), as_bool_mask(queries_mask))
        return _same_dtype(scores, q, d)

    return functools.wraps(original)(scores_fn)


def _make_colbert_scores(original):
    return _make_maxsim_scores(original, doc_rank=3)


def _make_colbert_kd_scores(original):
    return _make_maxsim_scores(original, doc_rank=4)


def _pad_uneven(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([r.shape[0] for r in rows], device=rows[0].device)
    padded = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    mask = torch.arange(padded.shape[1], device=padded.device) < lengths.unsqueeze(1)
    return padded, mask


def _make_colbert_scores_pairwise(original):
    def colbert_scores_pairwise(
        queries_embeddings, documents_embeddings, backend: str | None = None
    ):
        q, d = queries_embeddings, documents_embeddings
        call_original = lambda: original(q, d, **_backend_kwargs(backend))
        if isinstance(q, torch.Tensor) and isinstance(d, torch.Tensor):
            if q.dim() != 3 or d.dim() != 3 or not _wants_kernels(backend, q, d):
                return call_original()
            _, maxsim_pairs = kernels()
            return _same_dtype(maxsim_pairs(q, d), q, d)
        # uneven Python lists of (L_i, d) tensors: pad, and mask the padding out exactly
        if not isinstance(q, (list, tuple)) or not isinstance(d, (list, tuple)):
            return call_original()
        if len(q) == 0 or len(q) != len(d):
            return call_original()
        rows = [*q, *d]
        if any(not isinstance(r, torch.Tensor) or r.dim() != 2 for r in rows):
            return call_original()
        if not _wants_kernels(backend, *rows):
            return call_original()
        q_pad, q_mask = _pad_uneven(list(q))
        d_pad, d_mask = _pad_uneven(list(d))
        _, maxsim_pairs = kernels()
        return _same_dtype(maxsim_pairs(q_pad, d_pad, q_mask, d_mask), q_pad, d_pad)

    return functools.wraps(original)(colbert_scores_pairwise)


def _make_colbert_scores_call(original_call, scores_module):
    def __call__(
        self,
        queries_embeddings,
        documents_embeddings,
        queries_mask=None,
        documents_mask=None,
        backend: str | None = None,
    ):
        q, d = queries_embeddings, documents_embeddings
        masks = (queries_mask, documents_mask)
        if not _wants_kernels(backend, q, d, masks=masks) or q.dim() != 3 or d.dim() != 4:
            kwargs = {} if backend is None else {"backend": backend}
            return original_call(self, q, d, queries_mask, documents_mask, **kwargs)
        # (groups, N, Ld, d) flattened group-major is exactly the query-major column order
        groups, n, ld, dim = d.shape
        flat_mask = None if documents_mask is None else documents_mask.reshape(groups * n, ld)
        return scores_module.colbert_scores(
            q, d.reshape(groups * n, ld, dim), queries_mask, flat_mask, backend=backend
        )

    return functools.wraps(original_call)(__call__)


def _gathers_with_kernels(loss_obj, device: torch.device) -> bool:
    """Whether a PyLate contrastive loss gathers across ranks with the default ColBERT scorer on
    a device where the kernels run. The same answer on every rank (the same settings and device
    type), as it must be: it decides which collectives run."""
    if not getattr(loss_obj, "gather_across_devices", False):
        return False
    if os.environ.get(CROSS_RANK_ENV_VAR, "").strip().lower() not in ("1", "true", "yes", "on"):
        return False
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return False
    colbert = importlib.import_module("pylate.scores.colbert")
    if type(getattr(loss_obj, "score_metric", None)) is not colbert.ColBERTScores:
        return False
    return _wants_kernels(None, torch.empty(1, device=device))


def _model_attr(model, name: str):
    # the model may be wrapped in (D)DP
    return getattr(model, name) if hasattr(model, name) else getattr(model.module, name)


def _score_across_ranks(queries, stacked, stacked_mask, q_mask):
    """PyLate's in-batch scores of the local ``queries`` against every rank's stacked positive and
    negative groups ``(B, N, Ld, d)``, and the column of this rank's first document (query ``i``'s
    positive sits at ``offset + i * N``)."""
    import late_interaction_kernels as lik

    b, n, ld, dim = stacked.shape
    docs = zero_masked_tokens(stacked.reshape(b * n, ld, dim), stacked_mask.reshape(b * n, ld))
    scores, offset = lik.maxsim_across_ranks(
        queries, docs, as_bool_mask(q_mask), normalize=False, return_offset=True
    )
    return _same_dtype(scores, queries, docs), offset


def _make_contrastive_forward(original_forward):
    """``Contrastive.forward`` of PyLate 1.6 with the gather and the scoring in one cross-rank
    call; any other configuration runs PyLate's own forward."""

    def forward(self, sentence_features, labels=None):
        sentence_features = list(sentence_features)
        device = sentence_features[0]["input_ids"].device
        if not _gathers_with_kernels(self, device):
            return original_forward(self, sentence_features, labels)
        contrastive = importlib.import_module("pylate.losses.contrastive")
        embeddings = [
            torch.nn.functional.normalize(self.model(f)["token_embeddings"], p=2, dim=-1)
            for f in sentence_features
        ]
        masks = contrastive.extract_skiplist_mask(
            sentence_features=sentence_features, skiplist=_model_attr(self.model, "skiplist")
        )
        q_mask = None if _model_attr(self.model, "do_query_expansion") else masks[0]
        n = len(embeddings) - 1
        scores, offset = _score_across_ranks(
            embeddings[0],
            torch.stack(embeddings[1:], dim=1),
            torch.stack(masks[1:], dim=1),
            q_mask,
        )
        batch_size = embeddings[0].size(0)
        targets = torch.arange(batch_size, device=scores.device) * n + offset
        loss = torch.nn.functional.cross_entropy(
            scores / self.temperature, targets, reduction="mean" if self.size_average else "sum"
        )
        return loss * contrastive.get_world_size()

    return functools.wraps(original_forward)(forward)


def _make_cached_calculate_loss(original):
    """``CachedContrastive.calculate_loss`` of PyLate 1.6 with the gather and the scoring in one
    cross-rank call (one backward instead of one per query chunk: the same summed gradients)."""

    def calculate_loss(self, reps, masks, with_backward: bool = False):
        anchors = torch.cat(reps[0])
        others = [torch.cat(list(r)) for r in reps[1:]]
        if not _gathers_with_kernels(self, anchors.device):
            return original(self, reps, masks, with_backward)
        cached = importlib.import_module("pylate.losses.cached_contrastive")
        q_mask = None if _model_attr(self.model, "do_query_expansion") else masks[0]
        n = len(others)
        scores, offset = _score_across_ranks(
            anchors, torch.stack(others, dim=1), torch.stack(list(masks[1:]), dim=1), q_mask
        )
        batch_size = anchors.size(0)
        targets = torch.arange(batch_size, device=scores.device) * n + offset
        loss = torch.nn.functional.cross_entropy(
            scores / self.temperature, targets, reduction="sum"
        )
        loss = loss * cached.get_world_size()
        if with_backward:
            loss.backward()
            loss = loss.detach()
        return loss / batch_size if self.size_average else loss

    return functools.wraps(original)(calculate_loss)


def _pylate_modules() -> list[Any]:
    return [m for name, m in list(sys.modules.items()) if name.split(".")[0] == "pylate" and m]


def _functions_with_defaults(modules: list[Any]) -> list[Any]:
    """Functions and methods defined in ``modules`` (defaults may hold a captured scorer)."""
    found: dict[int, Any] = {}
    for module in modules:
        for value in list(vars(module).values()):
            if inspect.isfunction(value) and value.__module__ == module.__name__:
                found[id(value)] = value
            elif inspect.isclass(value) and value.__module__ == module.__name__:
                for member in vars(value).values():
                    fn = (
                        member.__func__
                        if isinstance(member, (staticmethod, classmethod))
                        else member
                    )
                    if inspect.isfunction(fn):
                        found[id(fn)] = fn
    return list(found.values())


def patch_pylate() -> bool:
    """Route PyLate's ColBERT scoring through the fused kernels (see the module docstring).

    Idempotent; undone exactly by :func:`unpatch_pylate`. Returns whether the patch is in place
    (``False`` when ``LATE_INTERACTION_KERNELS_DISABLE_PATCH=1``).

    Raises:
        ImportError: PyLate is not installed.
        UnsupportedVersionError: the installed version is outside ``>=1.5.1,<2``.
    """
    if patching_disabled():
        logger.info("late-interaction-kernels: PyLate patch disabled by the environment")
        return False
    found = installed_version("pylate", minimum=MINIMUM_VERSION, below=BELOW_VERSION)
    if _patches.active:
        return True
    colbert = importlib.import_module("pylate.scores.colbert")
    for name in _DEPENDENT_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
    originals = {
        "colbert_scores": colbert.colbert_scores,
        "colbert_kd_scores": colbert.colbert_kd_scores,
        "colbert_scores_pairwise": colbert.colbert_scores_pairwise,
    }
    makers = {
        "colbert_scores": _make_colbert_scores,
        "colbert_kd_scores": _make_colbert_kd_scores,
        "colbert_scores_pairwise": _make_colbert_scores_pairwise,
    }
    replacements = {id(fn): makers[name](fn) for name, fn in originals.items()}
    by_id = {id(fn): fn for fn in originals.values()}
    try:
        modules = _pylate_modules()
        # defaults first: the functions they live in are found through the unpatched modules
        _patches.swap_defaults(
            _functions_with_defaults(modules), by_id, lambda fn: replacements[id(fn)]
        )
        _patches.swap_module_globals(modules, by_id, lambda fn: replacements[id(fn)])
        _patch_contrastive_losses()
        scorer = getattr(colbert, "ColBERTScores", None)
        if scorer is not None:
            _patches.replace(
                scorer, "__call__", _make_colbert_scores_call(scorer.__call__, colbert)
            )
        places = sorted(
            {
                f"{getattr(owner, '__qualname__', None) or owner.__name__}.{attr}"
                for owner, attr, _ in _patches.records
            }
        )
        _patches.summary.append("routed " + ", ".join(places))
    except Exception:
        _patches.restore()
        raise
    _patches.log("PyLate", found)
    return True


def _patch_contrastive_losses() -> None:
    """Route the cross-rank gather of the contrastive losses that have one (PyLate 1.6's
    ``Contrastive.forward`` and ``CachedContrastive.calculate_loss``)."""
    for module_name, class_name, attr, maker in (
        ("pylate.losses.contrastive", "Contrastive", "forward", _make_contrastive_forward),
        (
            "pylate.losses.cached_contrastive",
            "CachedContrastive",
            "calculate_loss",
            _make_cached_calculate_loss,
        ),
    ):
        module = sys.modules.get(module_name)
        owner = getattr(module, class_name, None)
        if (
            owner is not None
            and attr in vars(owner)
            and hasattr(module, "all_gather_with_gradients")
        ):
            _patches.replace(owner, attr, maker(vars(owner)[attr]))


def unpatch_pylate() -> None:
    """Restore every object :func:`patch_pylate` replaced (a no-op when not patched)."""
    if _patches.active:
        _patches.restore()
        logger.info("late-interaction-kernels: PyLate unpatched")


def is_patched() -> bool:
    return _patches.active


def original_function(name: str):
    """PyLate's own ``pylate.scores.colbert.<name>`` (the one :func:`patch_pylate` replaced)."""
    colbert = importlib.import_module("pylate.scores.colbert")
    for owner, attr, old in _patches.records:
        if owner is colbert and attr == name:
            return old
    return getattr(colbert, name)


def replacement(name: str):
    """The routed twin of PyLate's ``name`` (whether or not the patch is in place)."""
    makers = {
        "colbert_scores": _make_colbert_scores,
        "colbert_kd_scores": _make_colbert_kd_scores,
        "colbert_scores_pairwise": _make_colbert_scores_pairwise,
    }
    return makers[name](original_function(name))
