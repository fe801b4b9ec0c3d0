"""A picture of decoded audio: waveform over a log-magnitude spectrogram, as a PNG.

Drawn with numpy and written with zlib (no plotting library): the waveform panel shows each
channel's min/max per pixel column, the spectrogram panel the channel mean's STFT in dB (80 dB
range, low frequencies at the bottom) through a dark-to-bright palette.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import torch

__all__ = ["audio_picture", "png_bytes", "write_audio_picture"]

_BACKGROUND = (16, 16, 24)
_WAVE_COLOURS = ((90, 200, 255), (255, 160, 90))


def png_bytes(rgb: np.ndarray) -> bytes:
    """An ``(H, W, 3)`` uint8 image as PNG bytes."""
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError("rgb must be an (H, W, 3) uint8 array")
    h, w, _ = rgb.shape
    raw = np.concatenate([np.zeros((h, 1), np.uint8), rgb.reshape(h, w * 3)], axis=1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw.tobytes(), 6))
        + chunk(b"IEND", b"")
    )


def _palette(v: np.ndarray) -> np.ndarray:
    """``v`` in [0, 1] to RGB: black, purple, orange, pale yellow."""
    stops = np.array([[0, 0, 4], [120, 28, 109], [237, 105, 37], [252, 255, 164]], np.float32)
    pos = np.clip(v, 0.0, 1.0) * (len(stops) - 1)
    lo = np.minimum(pos.astype(np.int64), len(stops) - 2)
    frac = (pos - lo)[..., None]
    return (stops[lo] * (1 - frac) + stops[lo + 1] * frac).astype(np.uint8)


def _waveform(audio: np.ndarray, width: int, height: int) -> np.ndarray:
    img = np.empty((height, width, 3), np.uint8)
    img[:] = _BACKGROUND
    channels, n = audio.shape
    lane = height // channels
    peak = max(float(np.abs(audio).max()), 1e-9)
    edges = np.linspace(0, n, width + 1).astype(np.int64)
    for c in range(channels):
        colour = _WAVE_COLOURS[c % len(_WAVE_COLOURS)]
        mid = c * lane + lane // 2
        img[mid, :] = (60, 60, 70)
        for x in range(width):
            # one sample of overlap with the neighbours keeps a sparse trace connected
            seg = audio[c, max(edges[x] - 1, 0) : edges[x + 1] + 1]
            top = mid - int(seg.max() / peak * (lane // 2 - 1))
            bottom = mid - int(seg.min() / peak * (lane // 2 - 1))
            img[top : bottom + 1, x] = colour
    return img


def _spectrogram(audio: np.ndarray, width: int, height: int) -> np.ndarray:
    mono = torch.from_numpy(audio.mean(axis=0))
    n_fft = 1 << max(5, min(11, int(np.log2(max(len(mono) // 8, 32)))))
    hop = max(1, len(mono) // width)
    spec = torch.stft(
        mono, n_fft, hop_length=hop, window=torch.hann_window(n_fft), return_complex=True,
        center=True,
    ).abs()  # fmt: skip
    db = 20 * torch.log10(spec.clamp(min=1e-10))
    db = (db - db.max() + 80.0) / 80.0  # the top 80 dB
    img = torch.nn.functional.interpolate(db[None, None], size=(height, width), mode="bilinear")
    return _palette(img[0, 0].flip(0).numpy())


def audio_picture(audio: torch.Tensor, *, width: int = 1200, height: int = 480) -> np.ndarray:
    """An ``(height, width, 3)`` uint8 picture of ``(channels, n)`` audio: waveform on top (a
    lane per channel, scaled to the peak), spectrogram below."""
    if not isinstance(audio, torch.Tensor) or audio.dim() != 2 or audio.shape[1] < 2:
        raise ValueError("audio must be a (channels, samples) tensor with at least 2 samples")
    if width < 16 or height < 32:
        raise ValueError(f"the picture must be at least 16 x 32 pixels, got {width} x {height}")
    x = audio.detach().float().cpu().numpy()
    top = height // 2
    return np.concatenate([_waveform(x, width, top), _spectrogram(x, width, height - top)], axis=0)


def write_audio_picture(audio: torch.Tensor, path: str | Path, **size: int) -> Path:
    """Write :func:`audio_picture` of ``audio`` to ``path`` as a PNG."""
    path = Path(path)
    path.write_bytes(png_bytes(audio_picture(audio, **size)))
    return path
