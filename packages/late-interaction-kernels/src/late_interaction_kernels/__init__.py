"""Fused Triton MaxSim (ColBERT/ColPali late interaction) scoring, forward and backward, with
colpali-engine and PyLate patchers."""

from importlib.metadata import PackageNotFoundError, version

from .integrations import (
    patch_colpali_engine,
    patch_pylate,
    unpatch_colpali_engine,
    unpatch_pylate,
)
from .ops.maxsim import BACKWARD_METHODS, maxsim, maxsim_pairs, maxsim_varlen
from .ops.maxsim_from_hidden import maxsim_from_hidden
from .ops.maxsim_residual import maxsim_residual
from .ops.retrieve import MaxSimScorer, retrieve

try:
    __version__ = version("late-interaction-kernels")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = [
    "BACKWARD_METHODS",
    "MaxSimScorer",
    "__version__",
    "maxsim",
    "maxsim_from_hidden",
    "maxsim_pairs",
    "maxsim_residual",
    "maxsim_varlen",
    "patch_colpali_engine",
    "patch_pylate",
    "retrieve",
    "unpatch_colpali_engine",
    "unpatch_pylate",
]
