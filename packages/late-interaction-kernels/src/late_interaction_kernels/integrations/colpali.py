"""Route colpali-engine's late-interaction scoring through the fused MaxSim kernels.

What is patched (colpali-engine >=0.3.11,<1, the versions whose losses derive from
``ColbertModule``):

* every hard-max MaxSim that the ColBERT losses compute as ``einsum`` + ``_aggregate``: the
  in-batch score matrix of ``ColbertLoss``, ``ColbertPairwiseCELoss`` and ``ColbertSigmoidLoss``
  (and of the inner in-batch loss that the negative losses call, so that term is computed once),
  the explicit positive term of ``ColbertNegativeCELoss`` / ``ColbertPairwiseNegativeCELoss``
  (``maxsim_pairs`` on the diagonal) and their ``[B, n_neg, Ld, d]`` negative slab (4-D
  ``maxsim``);
* ``BaseVisualRetrieverProcessor.score_multi_vector``.

The loss code itself is not replaced: the loss module sees a ``torch`` whose ``einsum`` returns a
pending score for the MaxSim equations, and ``ColbertModule._aggregate`` turns it into a fused
call. Anything else (``use_smooth_max=True``, devices where the kernels do not run, an unknown
equation, any other use of the pending value) evaluates the original ``einsum`` on the original
operands, so the results there are the library's own.

colpali-engine 0.3.17 and newer score the in-batch grid and the negative slab through their own
backend (``colpali_engine.utils.maxsim``, switch ``COLPALI_SCORES_BACKEND``), which calls
``late_interaction_kernels.autograd.maxsim``. On those versions only what that backend leaves
unfused is patched (the positive term), and ``score_multi_vector`` is left to it as well.

Padding: colpali-engine pads with exact zero vectors (on the right, and on the left after a
cross-device gather). Masks are derived from the zero rows so that every score equals the
original einsum's, in which padding takes part with similarity 0.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
from collections.abc import Iterator
from typing import Any

import torch

from ._patching import (
    PatchSet,
    installed_version,
    logger,
    patching_disabled,
    routes_to_kernels,
)
from ._scoring import kernels, zero_padding_masks

MINIMUM_VERSION = "0.3.11"
BELOW_VERSION = "1"

_patches = PatchSet("colpali-engine")

# einsum equations of the losses (all supported versions) -> (layout, dim_max, dim_sum) of the
# ``_aggregate`` call that reduces them to MaxSim scores
_MAXSIM_EQUATIONS: dict[str, tuple[str, int, int]] = {
    "bnd,csd->bcns": ("grid", 3, 2),
    "bnd,bsd->bns": ("pairs", 2, 1),
    "bnd,bld->bnl": ("pairs", 2, 1),
    "bnd,blsd->blns": ("slab", 3, 2),
    "bnd,bsld->bsnl": ("slab", 3, 2),
}


def _fused_maxsim(layout: str, query: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    maxsim, maxsim_pairs = kernels()
    q_mask = query.ne(0).any(dim=-1)  # a zero query token adds 0 either way
    d_mask = zero_padding_masks(doc)
    if layout == "pairs":
        scores = maxsim_pairs(query, doc, q_mask, d_mask)
    else:
        scores = maxsim(query, doc, q_mask, d_mask)
    # the einsum path keeps the embeddings' dtype; so does the patched one
    return scores.to(torch.promote_types(query.dtype, doc.dtype))


class _PendingMaxSim:
    """The token-similarity tensor of a MaxSim equation, not computed yet.

    ``ColbertModule._aggregate`` (patched) reduces it with the fused kernels; any other use
    computes the original ``einsum`` and continues with that tensor.
    """

    __slots__ = ("_tensor", "equation", "layout", "operands")

    def __init__(self, equation: str, layout: str, operands: tuple[torch.Tensor, torch.Tensor]):
        self.equation = equation
        self.layout = layout
        self.operands = operands
        self._tensor: torch.Tensor | None = None

    def materialize(self) -> torch.Tensor:
        if self._tensor is None:
            self._tensor = torch.einsum(self.equation, *self.operands)
        return self._tensor

    def __getattr__(self, name: str) -> Any:
        return getattr(self.materialize(), name)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        def real(x):
            return x.materialize() if isinstance(x, _PendingMaxSim) else x

        args = tuple(real(a) for a in args)
        kwargs = {k: real(v) for k, v in (kwargs or {}).items()}
        return func(*args, **kwargs)


class _TorchForLosses:
    """``torch`` as the loss module sees it while patched: ``einsum`` of a MaxSim equation on two
    tensors returns a :class:`_PendingMaxSim`; everything else is ``torch`` itself."""

    def __init__(self, real_torch):
        self._torch = real_torch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def einsum(self, equation, *operands):
        key = equation.replace(" ", "") if isinstance(equation, str) else None
        if key in _MAXSIM_EQUATIONS and len(operands) == 2:
            query, doc = operands
            layout = _MAXSIM_EQUATIONS[key][0]
            if routes_to_kernels(query, doc) and query.shape[-1] == doc.shape[-1] > 0:
                return _PendingMaxSim(key, layout, (query, doc))
        return self._torch.einsum(equation, *operands)


def _make_aggregate(original):
    def _aggregate(self, scores_raw, use_smooth_max, dim_max, dim_sum):
        if isinstance(scores_raw, _PendingMaxSim):
            _, want_max, want_sum = _MAXSIM_EQUATIONS[scores_raw.equation]
            if not use_smooth_max and (dim_max, dim_sum) == (want_max, want_sum):
                return _fused_maxsim(scores_raw.layout, *scores_raw.operands)
            scores_raw = scores_raw.materialize()
        return original(self, scores_raw, use_smooth_max, dim_max, dim_sum)

    return functools.wraps(original)(_aggregate)


def _make_score_multi_vector(original, get_torch_device):
    def score_multi_vector(qs, ps, batch_size: int = 128, device=None):
        target = torch.device(device or get_torch_device("auto"))
        probe = torch.empty(0, device=target)
        if len(qs) == 0 or len(ps) == 0 or not routes_to_kernels(probe):
            return original(qs, ps, batch_size=batch_size, device=device)
        maxsim, _ = kernels()
        pad = torch.nn.utils.rnn.pad_sequence
        rows = []
        for i in range(0, len(qs), batch_size):
            q = pad(list(qs[i : i + batch_size]), batch_first=True, padding_value=0).to(target)
            q_mask = q.ne(0).any(dim=-1)
            blocks = []
            for j in range(0, len(ps), batch_size):
                p = pad(list(ps[j : j + batch_size]), batch_first=True, padding_value=0).to(target)
                blocks.append(maxsim(q, p, q_mask, zero_padding_masks(p)))
            rows.append(torch.cat(blocks, dim=1).cpu())
        return torch.cat(rows, dim=0).to(torch.float32)

    return functools.wraps(original)(score_multi_vector)


def has_native_backend() -> bool:
    """Whether this colpali-engine scores through its own ``COLPALI_SCORES_BACKEND`` dispatcher."""
    return importlib.util.find_spec("colpali_engine.utils.maxsim") is not None


def patch_colpali_engine() -> bool:
    """Route colpali-engine's MaxSim scoring through the fused kernels (see the module docstring).

    Idempotent; undone exactly by :func:`unpatch_colpali_engine`. Returns whether the patch is in
    place (``False`` when ``LATE_INTERACTION_KERNELS_DISABLE_PATCH=1``).

    Raises:
        ImportError: colpali-engine is not installed.
        UnsupportedVersionError: the installed version is outside ``>=0.3.11,<1``.
    """
    if patching_disabled():
        logger.info("late-interaction-kernels: colpali-engine patch disabled by the environment")
        return False
    found = installed_version("colpali-engine", minimum=MINIMUM_VERSION, below=BELOW_VERSION)
    if _patches.active:
        return True
    losses = importlib.import_module("colpali_engine.loss.late_interaction_losses")
    processing = importlib.import_module("colpali_engine.utils.processing_utils")
    module_cls = getattr(losses, "ColbertModule", None)
    if module_cls is None or not hasattr(module_cls, "_aggregate"):
        raise RuntimeError(
            f"colpali-engine {found} has no ColbertModule._aggregate; this patcher cannot apply"
        )
    native = has_native_backend()
    try:
        _patches.replace(losses, "torch", _TorchForLosses(torch))
        _patches.replace(module_cls, "_aggregate", _make_aggregate(module_cls._aggregate))
        if native:
            _patches.summary.append(
                "fused the explicit positive term of the negative-document losses; the in-batch "
                "grid, the negative slab and score_multi_vector stay with colpali-engine's own "
                "backend (COLPALI_SCORES_BACKEND), which calls late_interaction_kernels.autograd"
            )
        else:
            base = processing.BaseVisualRetrieverProcessor
            torch_utils = importlib.import_module("colpali_engine.utils.torch_utils")
            original = base.__dict__["score_multi_vector"].__func__
            replacement = _make_score_multi_vector(original, torch_utils.get_torch_device)
            _patches.replace(base, "score_multi_vector", staticmethod(replacement))
            _patches.summary.append(
                "fused the in-batch grid, positive term and negative slab of the ColBERT losses "
                "and BaseVisualRetrieverProcessor.score_multi_vector"
            )
    except Exception:
        _patches.restore()
        raise
    _patches.log("colpali-engine", found)
    return True


def unpatch_colpali_engine() -> None:
    """Restore every object :func:`patch_colpali_engine` replaced (a no-op when not patched)."""
    if _patches.active:
        _patches.restore()
        logger.info("late-interaction-kernels: colpali-engine unpatched")


def is_patched() -> bool:
    return _patches.active


def original_attribute(owner: Any, attr: str) -> Any:
    """``owner.attr`` as colpali-engine defines it (what the patch replaced, if it did)."""
    for patched, name, old in _patches.records:
        if patched is owner and name == attr:
            return old
    return (
        owner.__dict__[attr]
        if isinstance(owner, type) and attr in owner.__dict__
        else getattr(owner, attr)
    )


@contextlib.contextmanager
def routed() -> Iterator[None]:
    """Run a block with the patch in place (applied for the block only when it was not)."""
    if _patches.active:
        yield
        return
    patch_colpali_engine()
    try:
        yield
    finally:
        unpatch_colpali_engine()
