"""WAV files from decoded audio: a header (also for a body that is still being decoded), the
samples in either encoding (16-bit PCM by default, what ``wave``, browsers and audio tools open;
32-bit float as ``"f32"``), and the ACE-Step pipeline's peak normalisation."""

from __future__ import annotations

import struct
from typing import Literal

import numpy as np
import torch

WavFormat = Literal["f32", "pcm16"]
WAV_FORMATS: tuple[str, ...] = ("f32", "pcm16")

__all__ = ["WAV_FORMATS", "peak_normalize", "wav_bytes", "wav_header", "wav_samples"]

_TAGS = {"f32": (3, 4), "pcm16": (1, 2)}  # (WAVE format tag, bytes per sample)


def _check_format(fmt: str) -> tuple[int, int]:
    if fmt not in _TAGS:
        raise ValueError(f"format must be one of {WAV_FORMATS}, got {fmt!r}")
    return _TAGS[fmt]


def wav_header(samples: int, channels: int, sample_rate: int, fmt: WavFormat = "pcm16") -> bytes:
    """The 44-byte (PCM) or 58-byte (IEEE float, with its ``fact`` chunk) header of a WAV file of
    ``samples`` frames: known before the first sample is decoded, so a streamed body can follow.

    Raises:
        ValueError: a bad ``format``, a negative ``samples`` or non-positive ``channels`` /
            ``sample_rate``, or a file over the format's 4 GiB.
    """
    tag, width = _check_format(fmt)
    if not isinstance(samples, int) or samples < 0:
        raise ValueError(f"samples must be an int >= 0, got {samples!r}")
    for name, value in (("channels", channels), ("sample_rate", sample_rate)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    data = samples * channels * width
    fmt_chunk = struct.pack(
        "<HHIIHH", tag, channels, sample_rate, sample_rate * channels * width, channels * width,
        8 * width,
    )  # fmt: skip
    extra = b""
    if tag == 3:  # non-PCM formats carry a cbSize and a fact chunk
        fmt_chunk += struct.pack("<H", 0)
        extra = b"fact" + struct.pack("<II", 4, samples)
    riff = 4 + (8 + len(fmt_chunk)) + len(extra) + 8 + data
    if riff >= 1 << 32:
        raise ValueError(f"{samples} samples of {channels} channels do not fit a WAV file")
    return (
        b"RIFF" + struct.pack("<I", riff) + b"WAVE"
        + b"fmt " + struct.pack("<I", len(fmt_chunk)) + fmt_chunk
        + extra
        + b"data" + struct.pack("<I", data)
    )  # fmt: skip


def wav_samples(audio: torch.Tensor, fmt: WavFormat = "pcm16") -> bytes:
    """``(channels, n)`` audio as interleaved little-endian samples (``pcm16`` clips to
    ``[-1, 1]``)."""
    _check_format(fmt)
    if not isinstance(audio, torch.Tensor) or audio.dim() != 2:
        raise ValueError("audio must be a (channels, samples) tensor")
    x = audio.detach().float().cpu().t().contiguous().numpy()
    if fmt == "pcm16":
        x = np.round(np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2")
    else:
        x = x.astype("<f4", copy=False)
    return x.tobytes()


def wav_bytes(audio: torch.Tensor, sample_rate: int, fmt: WavFormat = "pcm16") -> bytes:
    """A whole WAV file of ``(channels, n)`` audio: 16-bit PCM (clipped to ``[-1, 1]``) unless
    ``fmt="f32"``."""
    if not isinstance(audio, torch.Tensor) or audio.dim() != 2:
        raise ValueError("audio must be a (channels, samples) tensor")
    return wav_header(audio.shape[1], audio.shape[0], sample_rate, fmt) + wav_samples(audio, fmt)


def peak_normalize(audio: torch.Tensor, target_db: float = -1.0) -> torch.Tensor:
    """Scale ``audio`` so its peak is ``target_db`` dBFS: what ACE-Step's pipeline does to the
    decoded clip (it needs the whole clip, so streamed audio is sent as decoded)."""
    peak = audio.abs().amax().clamp(min=1e-6)
    return audio * (10.0 ** (target_db / 20.0) / peak)
