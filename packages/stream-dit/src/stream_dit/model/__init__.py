"""Denoisers: the adapter protocol, the built-in 1-D diffusion transformer, and (extra
``diffusers``) ACE-Step 1.5's transformer in :mod:`stream_dit.model.ace_step` and Stable Audio
Open's in :mod:`stream_dit.model.stable_audio`."""

from .adapter import DenoiserAdapter
from .dit import FRAME_RATE, LATENT_CHANNELS, PRESETS, DiT1D, DiTConfig, build_model
from .registry import MODELS, build_denoiser, default_preset

__all__ = [
    "FRAME_RATE",
    "LATENT_CHANNELS",
    "MODELS",
    "PRESETS",
    "DenoiserAdapter",
    "DiT1D",
    "DiTConfig",
    "build_denoiser",
    "build_model",
    "default_preset",
]
