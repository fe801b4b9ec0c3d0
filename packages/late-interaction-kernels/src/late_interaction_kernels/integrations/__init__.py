"""Patchers that route colpali-engine's, PyLate's and Sentence Transformers' MaxSim scoring through this package.

Each patcher is idempotent, undone exactly by its ``unpatch_*`` twin, disabled by
``LATE_INTERACTION_KERNELS_DISABLE_PATCH=1``, and imports its library only when called.
"""

from __future__ import annotations

from ._patching import DISABLE_ENV_VAR, UnsupportedVersionError

__all__ = [
    "DISABLE_ENV_VAR",
    "UnsupportedVersionError",
    "patch_colpali_engine",
    "patch_pylate",
    "patch_sentence_transformers",
    "unpatch_colpali_engine",
    "unpatch_pylate",
    "unpatch_sentence_transformers",
]


def patch_colpali_engine() -> bool:
    from .colpali import patch_colpali_engine as patch

    return patch()


def unpatch_colpali_engine() -> None:
    from .colpali import unpatch_colpali_engine as unpatch

    unpatch()


def patch_pylate() -> bool:
    from .pylate import patch_pylate as patch

    return patch()


def unpatch_pylate() -> None:
    from .pylate import unpatch_pylate as unpatch

    unpatch()


def patch_sentence_transformers() -> bool:
    from .sentence_transformers import patch_sentence_transformers as patch

    return patch()


def unpatch_sentence_transformers() -> None:
    from .sentence_transformers import unpatch_sentence_transformers as unpatch

    unpatch()
