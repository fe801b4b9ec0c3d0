"""Audio decoders by name, matched to the denoiser they decode for."""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Literal

import torch

from .engine import DecoderEngine, DecoderMode
from .stage import AudioDecoder, default_window
from .windows import window_lengths

__all__ = ["VAES", "build_audio_decoder", "default_vae"]

#: ``--vae`` names: ``auto`` picks :func:`default_vae` (nothing without diffusers), ``none`` serves
#: latents only; the others are :data:`~stream_dit.decode.oobleck.VAE_PRESETS`.
VAES: tuple[str, ...] = ("auto", "none", "tiny", "ace-step", "stable-audio")


def default_vae(model: str, preset: str | None) -> str:
    """The VAE a model's latents are decoded with: ``tiny`` for the tiny sizes (CPU), Stable
    Audio's for ``stable-audio``, ACE-Step 1.5's otherwise (the built-in DiT makes 64 channels at
    25 frames per second, ACE-Step's latent format)."""
    if preset in (None, "tiny"):
        return "tiny"
    return "stable-audio" if model == "stable-audio" else "ace-step"


def build_audio_decoder(
    vae: str = "auto",
    *,
    model: str = "dit",
    preset: str | None = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    mode: DecoderMode | Literal["auto"] = "eager",
    window: int | None = None,
    context: int | None = None,
    crossfade: int = 1,
    window_align: int = 16,
    batch_windows: int = 1,
    latent_channels: int | None = None,
) -> AudioDecoder | None:
    """An :class:`AudioDecoder` around a seeded random-weight Oobleck VAE (``None`` for
    ``vae="none"``, and for ``"auto"`` when diffusers is not installed).

    ``latent_channels`` (the denoiser's) sizes the ``tiny`` VAE's input; ``auto`` falls back to
    that tiny VAE when the model's own would not take its latents (a tiny test model).

    ``mode`` is a :class:`DecoderEngine` mode, or ``"auto"``: ``"fused-graphs"`` (the Triton
    decoder in CUDA graphs) on a CUDA device, ``"eager"`` elsewhere.

    Raises:
        ValueError: an unknown ``vae``. ImportError: a named VAE without the diffusers extra.
    """
    if vae not in VAES:
        raise ValueError(f"vae={vae!r} is not one of {VAES}")
    if vae == "none":
        return None
    auto = vae == "auto"
    if auto:
        if importlib.util.find_spec("diffusers") is None:
            return None
        vae = default_vae(model, preset)
    from .oobleck import VAE_PRESETS, build_decoder

    preset_of = VAE_PRESETS[vae]
    mismatched = latent_channels not in (None, preset_of.decoder_input_channels)
    if mismatched and (auto or vae == "tiny"):
        # a named published VAE keeps its own input; the session then refuses the mismatch
        preset_of = dataclasses.replace(VAE_PRESETS["tiny"], decoder_input_channels=latent_channels)
    adapter = build_decoder(preset_of, seed=seed, device=device, dtype=dtype)
    if mode == "auto":
        mode = "fused-graphs" if adapter.device.type == "cuda" else "eager"
    if window is None:
        window = default_window(mode)
    graph_lengths = None if mode == "eager" else window_lengths(window, window_align)
    engine = DecoderEngine(adapter, max_batch=batch_windows, mode=mode, graph_lengths=graph_lengths)
    return AudioDecoder(
        engine, window=window, context=context, crossfade=crossfade, window_align=window_align
    )
