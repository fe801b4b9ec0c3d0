"""Engines that run a denoiser for the session."""

from .base import Engine, derive_depth
from .torch_engine import TorchEngine

__all__ = ["Engine", "TorchEngine", "derive_depth"]
