"""Fused Triton vector-quantizer kernels: EMA codebook update with dead-code restarts and nearest-code search, VQ and residual-VQ modules."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vq-kernels")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["__version__"]
