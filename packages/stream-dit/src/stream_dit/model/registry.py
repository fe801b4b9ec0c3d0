"""Denoisers by name: the built-in DiT presets and the diffusers models the runtime serves."""

from __future__ import annotations

import torch

#: ``--model`` names; ``ace-step`` and ``stable-audio`` need the ``diffusers`` extra.
MODELS: tuple[str, ...] = ("dit", "ace-step", "stable-audio")


def default_preset(model: str, device: torch.device | str) -> str:
    """The size a bench or server uses when none is named: the largest on CUDA, the tiny on CPU."""
    on_gpu = torch.device(device).type == "cuda"
    if model in ("ace-step", "stable-audio"):
        return "published" if on_gpu else "tiny"
    return "large" if on_gpu else "tiny"


def build_denoiser(
    model: str = "dit",
    preset: str | None = None,
    *,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
):
    """A seeded denoiser: ``model="dit"`` with a :data:`~stream_dit.model.PRESETS` size, or
    ``model="ace-step"`` (diffusers' ``AceStepTransformer1DModel``, sizes ``tiny``/``small``/
    ``published``) or ``model="stable-audio"`` (diffusers' ``StableAudioDiTModel``, sizes ``tiny``/
    ``published``) with random weights.

    Raises:
        ValueError: for an unknown model or preset.
        ImportError: for ``ace-step`` or ``stable-audio`` without the ``diffusers`` extra.
    """
    if model not in MODELS:
        raise ValueError(f"model={model!r} is not one of {MODELS}")
    preset = preset or default_preset(model, device)
    if model == "ace-step":
        from .ace_step import build_ace_step

        return build_ace_step(preset, seed=seed, device=device, dtype=dtype)
    if model == "stable-audio":
        from .stable_audio import build_stable_audio

        return build_stable_audio(preset, seed=seed, device=device, dtype=dtype)
    from .dit import build_model

    return build_model(preset, seed=seed, device=device, dtype=dtype)
