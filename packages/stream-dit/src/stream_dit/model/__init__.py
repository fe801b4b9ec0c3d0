"""Denoisers: the adapter protocol and the built-in 1-D diffusion transformer."""

from .adapter import DenoiserAdapter
from .dit import FRAME_RATE, LATENT_CHANNELS, PRESETS, DiT1D, DiTConfig, build_model

__all__ = [
    "FRAME_RATE",
    "LATENT_CHANNELS",
    "PRESETS",
    "DenoiserAdapter",
    "DiT1D",
    "DiTConfig",
    "build_model",
]
