"""Fused Triton MaxSim (ColBERT/ColPali late interaction) scoring, forward and backward, with
colpali-engine, PyLate and Sentence Transformers patchers.

The public surface of late-interaction-kernels 0.4.5 is kept name for name (``MaxSimScorer``,
``retrieve``, ``maxsim``, ``maxsim_pairs``, ``maxsim_varlen``, ``maxsim_padded``, the patchers and
the ``reference`` module at the top; ``score_pairs``, ``padded``, ``fused_head``, ``plaid``,
``topk``, ``fp8``, ``pylate_compat``, ``colpali_compat``, ``autograd`` and ``mps`` as submodules);
additions are keyword-only arguments or separate names.
"""

from importlib.metadata import PackageNotFoundError, version

from . import reference
from .distributed.cross_rank import maxsim_across_ranks
from .distributed.sharded_compressed import ShardedCompressedIndex
from .distributed.sharded_index import ShardedMaxSimIndex
from .fused_head import maxsim_from_hidden
from .integrations import (
    patch_colpali_engine,
    patch_pylate,
    patch_sentence_transformers,
    unpatch_colpali_engine,
    unpatch_pylate,
    unpatch_sentence_transformers,
)
from .ops.compressed import CompressedMaxSimIndex
from .ops.maxsim import BACKWARD_METHODS, maxsim, maxsim_pairs
from .ops.maxsim import maxsim_varlen as maxsim_varlen_pairs
from .ops.retrieve import MaxSimIndex
from .padded import maxsim_padded
from .plaid import maxsim_residual
from .retrieve import MaxSimScorer, retrieve
from .varlen import maxsim_varlen
from .warmup import warmup

try:
    __version__ = version("late-interaction-kernels")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = [
    "BACKWARD_METHODS",
    "CompressedMaxSimIndex",
    "MaxSimIndex",
    "MaxSimScorer",
    "ShardedCompressedIndex",
    "ShardedMaxSimIndex",
    "__version__",
    "maxsim",
    "maxsim_across_ranks",
    "maxsim_from_hidden",
    "maxsim_padded",
    "maxsim_pairs",
    "maxsim_residual",
    "maxsim_varlen",
    "maxsim_varlen_pairs",
    "patch_colpali_engine",
    "patch_pylate",
    "patch_sentence_transformers",
    "reference",
    "retrieve",
    "unpatch_colpali_engine",
    "unpatch_pylate",
    "unpatch_sentence_transformers",
    "warmup",
]
