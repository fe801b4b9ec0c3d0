"""Fused Triton vector-quantizer kernels: EMA codebook update with dead-code restarts and
nearest-code search, VQ and residual-VQ modules.

Public API:

* :func:`ema_update_` — one in-place EMA codebook step (scatter statistics, EMA blend, codebook
  refresh, dead-code counter and restarts), for one codebook or a stack of them;
* :func:`ema_statistics` — per-code counts and sums without a ``(B, K)`` one-hot;
* :func:`quantize` — nearest code(s) with distance and argmin fused;
* :func:`residual_quantize` — every level of a residual quantizer in one launch, with the
  straight-through output, the losses and the stacked inputs of the EMA update;
* :class:`VectorQuantizer`, :class:`ResidualVQ` — nn.Modules over them; :func:`perplexity`;
* :func:`warmup` — compile every kernel a step at the named shapes needs, before the first step.
"""

from importlib.metadata import PackageNotFoundError, version

from .modules import ResidualVQ, VectorQuantizer, VQOutput, perplexity
from .ops.ema_update import DEFAULT_THRESHOLDS, SEMANTICS, ema_statistics, ema_update_
from .ops.quantize import METRICS, quantize
from .ops.residual_quantize import ResidualQuantized, residual_quantize
from .warmup import warmup

try:
    __version__ = version("vq-kernels")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = [
    "DEFAULT_THRESHOLDS",
    "METRICS",
    "SEMANTICS",
    "ResidualQuantized",
    "ResidualVQ",
    "VQOutput",
    "VectorQuantizer",
    "__version__",
    "ema_statistics",
    "ema_update_",
    "perplexity",
    "quantize",
    "residual_quantize",
    "warmup",
]
