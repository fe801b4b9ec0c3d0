"""A streaming runtime that serves many diffusion-transformer requests per batched tick, with fused classifier-free guidance."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("stream-dit")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["__version__"]
