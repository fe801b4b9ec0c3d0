"""Fused Triton MaxSim (ColBERT/ColPali late interaction) scoring, forward and backward."""

from importlib.metadata import PackageNotFoundError, version

from .ops.maxsim import BACKWARD_METHODS, maxsim, maxsim_pairs, maxsim_varlen

try:
    __version__ = version("late-interaction-kernels")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["BACKWARD_METHODS", "__version__", "maxsim", "maxsim_pairs", "maxsim_varlen"]
