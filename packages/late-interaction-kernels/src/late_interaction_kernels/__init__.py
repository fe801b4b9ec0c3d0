"""Fused Triton MaxSim (ColBERT/ColPali late interaction) scoring, forward and backward, with colpali-engine and PyLate patchers."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("late-interaction-kernels")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["__version__"]
