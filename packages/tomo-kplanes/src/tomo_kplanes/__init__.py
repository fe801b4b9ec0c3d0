"""Electron-tomography reconstruction with a rotated K-Planes (TILTED) field and fused Triton plane interpolation."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tomo-kplanes")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["__version__"]
