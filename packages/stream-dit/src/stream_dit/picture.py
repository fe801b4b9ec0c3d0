"""A picture of decoded audio, as a PNG: a title that says what the clip is (length, channels,
sample rate), each channel's waveform over each channel's log-magnitude spectrogram, one time
axis in seconds, amplitude and frequency axes, and a colour bar in dB.

Drawn with numpy and written with zlib, so that the package needs no plotting or imaging library
(the text comes from the small bitmap font of :mod:`.bitmap_font`): a waveform panel shows its channel's min/max per pixel column on the clip's
common peak scale; a spectrogram panel shows its channel's STFT magnitude in dB below the loudest
bin of all channels (80 dB range, low frequencies at the bottom) through a dark-to-bright palette.
:func:`audio_figure` returns the picture with every text on it and where it is.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .bitmap_font import text_mask, text_width

__all__ = [
    "AudioFigure",
    "FigureText",
    "audio_figure",
    "audio_picture",
    "png_bytes",
    "write_audio_picture",
]

_BACKGROUND = (16, 16, 24)
_WAVE_COLOURS = ((90, 200, 255), (255, 160, 90))
_TITLE_COLOUR = (255, 255, 255)
_TEXT_COLOUR = (220, 220, 230)
_AXIS_COLOUR = (140, 140, 155)
_FRAME_COLOUR = (70, 70, 85)
_LABEL_BOX = (0, 0, 0)
#: the spectrograms show this many dB below the loudest bin
_DB_RANGE = 80.0

@dataclass(frozen=True)
class FigureText:
    """A text drawn on an :class:`AudioFigure`.

    Attributes:
        text: what it says.
        role: what it is: ``"title"``, ``"channel"`` (a panel's channel name), ``"x-label"`` and
            ``"y-label"`` (axis names with their units), ``"x-tick"`` and ``"y-tick"`` (values on
            the axes), ``"colorbar-label"`` and ``"colorbar-tick"``.
        box: ``(x0, y0, x1, y1)``, the pixels it covers (end exclusive), within the picture.
        vertical: drawn turned a quarter left (reads upwards), as axis names at the side are.
    """

    text: str
    role: str
    box: tuple[int, int, int, int]
    vertical: bool = False


@dataclass
class AudioFigure:
    """A picture made by :func:`audio_figure`: the pixels and the texts drawn on them."""

    #: ``(height, width, 3)`` uint8 RGB
    image: np.ndarray
    #: the whole title, before it was wrapped to the picture's width
    title: str
    texts: list[FigureText] = field(default_factory=list)

    def strings(self, role: str | None = None) -> list[str]:
        """The texts of ``role`` (all texts when ``None``), top to bottom, left to right."""
        return [t.text for t in self.texts if role is None or t.role == role]


class _Canvas:
    def __init__(self, width: int, height: int, scale: int) -> None:
        self.image = np.empty((height, width, 3), np.uint8)
        self.image[:] = _BACKGROUND
        self.scale = scale
        self.texts: list[FigureText] = []

    def text(
        self,
        text: str,
        role: str,
        x: int,
        y: int,
        anchor: str = "lt",
        colour: tuple[int, int, int] = _TEXT_COLOUR,
        vertical: bool = False,
        box: tuple[int, int, int] | None = None,
    ) -> None:
        """Draw ``text`` placed by ``anchor`` (horizontal ``l``/``m``/``r``, vertical
        ``t``/``m``/``b``) at ``(x, y)``; ``box`` fills a margin of that many pixels around it
        with that colour first (a label over a panel)."""
        mask = text_mask(text, self.scale)
        if vertical:
            mask = np.rot90(mask)
        h, w = mask.shape
        x0 = x - {"l": 0, "m": w // 2, "r": w}[anchor[0]]
        y0 = y - {"t": 0, "m": h // 2, "b": h}[anchor[1]]
        if box is not None:
            m = self.scale
            self._fill(x0 - m, y0 - m, x0 + w + m, y0 + h + m, box)
        region = self._clip(x0, y0, x0 + w, y0 + h)
        if region is None:
            return
        cx0, cy0, cx1, cy1 = region
        sub = mask[cy0 - y0 : cy1 - y0, cx0 - x0 : cx1 - x0]
        self.image[cy0:cy1, cx0:cx1][sub] = colour
        self.texts.append(FigureText(text, role, region, vertical))

    def _clip(self, x0: int, y0: int, x1: int, y1: int) -> tuple[int, int, int, int] | None:
        height, width = self.image.shape[:2]
        x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, width), min(y1, height)
        return (x0, y0, x1, y1) if x0 < x1 and y0 < y1 else None

    def _fill(self, x0: int, y0: int, x1: int, y1: int, colour) -> None:
        region = self._clip(x0, y0, x1, y1)
        if region is not None:
            self.image[region[1] : region[3], region[0] : region[2]] = colour

    def frame(self, x0: int, y0: int, x1: int, y1: int) -> None:
        """A one-pixel outline just outside the panel ``[x0, x1) x [y0, y1)``."""
        self._fill(x0 - 1, y0 - 1, x1 + 1, y0, _FRAME_COLOUR)
        self._fill(x0 - 1, y1, x1 + 1, y1 + 1, _FRAME_COLOUR)
        self._fill(x0 - 1, y0, x0, y1, _FRAME_COLOUR)
        self._fill(x1, y0, x1 + 1, y1, _FRAME_COLOUR)

    def hline(self, x0: int, x1: int, y: int) -> None:
        self._fill(x0, y, x1, y + max(1, self.scale // 2), _AXIS_COLOUR)

    def vline(self, x: int, y0: int, y1: int) -> None:
        self._fill(x, y0, x + max(1, self.scale // 2), y1, _AXIS_COLOUR)


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


def _waveform(
    signal: np.ndarray, peak: float, width: int, height: int, colour: tuple[int, int, int]
) -> np.ndarray:
    """One channel's min/max per pixel column, ``peak`` at the panel's top row and ``-peak`` at
    its bottom row (see :func:`_amplitude_row`)."""
    img = np.empty((height, width, 3), np.uint8)
    img[:] = _BACKGROUND
    n = signal.shape[0]
    mid = _amplitude_row(0.0, peak, height)
    img[mid, :] = (60, 60, 70)
    edges = np.linspace(0, n, width + 1).astype(np.int64)
    for x in range(width):
        # one sample of overlap with the neighbours keeps a sparse trace connected
        seg = signal[max(edges[x] - 1, 0) : edges[x + 1] + 1]
        top = _amplitude_row(float(seg.max()), peak, height)
        bottom = _amplitude_row(float(seg.min()), peak, height)
        img[top : bottom + 1, x] = colour
    return img


def _amplitude_row(value: float, peak: float, height: int) -> int:
    half = (height - 1) / 2
    return round(half - value / peak * half)


def _spectrograms(audio: np.ndarray, width: int, height: int) -> np.ndarray:
    """``(channels, height, width)`` in [0, 1]: each channel's STFT magnitude in dB, 0 at
    :data:`_DB_RANGE` below the loudest bin of all channels and 1 at it, low frequencies in the
    last row."""
    signal = torch.from_numpy(audio)
    n = signal.shape[1]
    n_fft = 1 << max(5, min(11, int(np.log2(max(n // 8, 32)))))
    hop = max(1, n // width)
    spec = torch.stft(
        signal, n_fft, hop_length=hop, window=torch.hann_window(n_fft), return_complex=True,
        center=True, pad_mode="reflect" if n > n_fft // 2 else "constant",
    ).abs()  # fmt: skip
    db = 20 * torch.log10(spec.clamp(min=1e-10))
    level = ((db - db.max() + _DB_RANGE) / _DB_RANGE).clamp(0.0, 1.0)
    img = torch.nn.functional.interpolate(level[:, None], size=(height, width), mode="bilinear")
    return img[:, 0].flip(1).numpy()


def _nice_step(span: float, count: int) -> float:
    """The smallest of 1, 2 and 5 times a power of ten that splits ``span`` into at most
    ``count`` steps."""
    raw = span / max(count, 1)
    if raw <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * power >= raw * (1 - 1e-9):
            return m * power
    return 10 * power


def _ticks(span: float, count: int, *, integer: bool = False) -> tuple[list[float], list[str]]:
    """Round values from 0 to ``span``, ``count`` steps or fewer, though at least one step (a
    lone 0 says nothing about the scale), and their labels."""
    step = _nice_step(span, count)
    if step > span > 0:
        power = 10.0 ** math.floor(math.log10(span))
        step = max(m * power for m in (1, 2, 5) if m * power <= span)
    if integer:
        step = max(1.0, round(step))
    values = [i * step for i in range(int(span / step * (1 + 1e-9)) + 1)]
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return values, [f"{v:.{decimals}f}" for v in values]


def _rate_text(rate: float) -> str:
    # a no-break space: the number and its unit stay on one line of a wrapped title
    if rate >= 1000 and rate % 100 == 0:
        return f"{rate / 1000:g}\N{NO-BREAK SPACE}kHz"
    return f"{rate:g}\N{NO-BREAK SPACE}Hz"


def _default_channel_names(channels: int) -> list[str]:
    if channels == 1:
        return ["mono"]
    if channels == 2:
        return ["left", "right"]
    return [f"channel {c + 1}" for c in range(channels)]


def _wrap(text: str, width: int, scale: int, max_lines: int) -> list[str]:
    """``text`` broken at spaces into lines of at most ``width`` pixels; past ``max_lines``, or
    where one word is wider than that, the text is cut and ends in an ellipsis."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and text_width(f"{lines[-1]} {word}", scale) <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    cut = len(lines) > max_lines
    lines = lines[:max_lines]
    for i, line in enumerate(lines):
        if text_width(line, scale) > width or (cut and i == len(lines) - 1):
            while line and text_width(line + "…", scale) > width:
                line = line[:-1]
            lines[i] = line.rstrip() + "…"
    return lines


def _fitting(candidates: Sequence[str], room: int, scale: int) -> str:
    """The first of ``candidates`` (longest first) that fits ``room`` pixels, else the last."""
    for text in candidates:
        if text_width(text, scale) <= room:
            return text
    return candidates[-1]


def audio_figure(
    audio: torch.Tensor,
    *,
    width: int = 1200,
    height: int = 720,
    sample_rate: float | None = None,
    title: str | None = None,
    channel_names: Sequence[str] | None = None,
) -> AudioFigure:
    """A ``width`` x ``height`` picture of ``(channels, n)`` audio, with the texts drawn on it.

    Top to bottom: the title (``title``, default ``"Decoded audio"``, followed by the clip's
    length, channels and sample rate; wrapped to the width), a waveform panel per channel on
    the clip's common peak scale (amplitude axis: minus the peak, 0, the peak), their time axis,
    a spectrogram panel per channel (frequency axis in Hz, or kHz from a 2 kHz Nyquist frequency
    up) with a colour bar in dB below the loudest bin, and their time axis. Each panel is
    labelled with its channel's name (``channel_names``; default ``left``/``right`` for two
    channels, ``mono`` for one, ``channel 1``... otherwise). Without ``sample_rate`` the axes
    count samples and cycles per sample instead of seconds and Hz.

    Raises:
        ValueError: ``audio`` is not ``(channels, n)`` with ``n >= 2``, ``channel_names`` does not
            name each channel, ``sample_rate`` is not positive, or the picture is too small to
            hold the panels and their labels (the message says how large it must be).
    """
    if not isinstance(audio, torch.Tensor) or audio.dim() != 2 or audio.shape[1] < 2:
        raise ValueError("audio must be a (channels, samples) tensor with at least 2 samples")
    channels, n = audio.shape
    if channels < 1:
        raise ValueError("audio must have at least one channel")
    if sample_rate is not None and not sample_rate > 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate!r}")
    names = list(channel_names) if channel_names is not None else None
    if names is None:
        names = _default_channel_names(channels)
    elif len(names) != channels:
        raise ValueError(f"channel_names must name the {channels} channels, got {names!r}")

    s = max(1, min(4, width // 600, height // 360))  # the font's pixel size
    text_h, line = 9 * s, 11 * s
    # small pictures (the font at its own size) get tighter spacing, to leave room for panels
    pad, gap, tick_len = (3, 2, 2) if s == 1 else (6 * s, 3 * s, 3 * s)

    # what the picture shows, in words and numbers
    kind = {1: "mono", 2: "stereo"}.get(channels, f"{channels} channels")
    if sample_rate is not None:
        facts = f"{n / sample_rate:.2f} s, {kind}, {_rate_text(sample_rate)} sample rate"
        duration, time_names = n / sample_rate, ["time (s)", "s"]
        nyquist = sample_rate / 2
        khz = nyquist >= 2000
        freq_unit = 1000.0 if khz else 1.0
        freq_names = ["frequency (kHz)", "kHz"] if khz else ["frequency (Hz)", "Hz"]
    else:
        facts = f"{n} samples, {kind} (no sample rate given)"
        duration, time_names = float(n), ["time (samples)", "samples"]
        nyquist, freq_unit = 0.5, 1.0
        freq_names = ["frequency (cycles per sample)", "cycles/sample"]
    heading = f"{title or 'Decoded audio'} — {facts}"

    # the heights: title, panels, time axes
    title_lines = _wrap(heading, width - 2 * pad, s, max_lines=max(1, height // (8 * line)))
    axis_h = tick_len + gap + text_h + gap + text_h  # ticks, their labels, the axis name
    # the labels of ticks at the edges of neighbouring panels would touch across a smaller gap
    panel_gap = text_h + gap
    fixed_h = (
        pad + len(title_lines) * line + pad  # the title
        + 2 * (channels - 1) * panel_gap  # between the panels of a group
        + 1 + axis_h + 2 * pad  # the waveforms' time axis, and room before the spectrograms
        + 1 + axis_h + pad  # the spectrograms' time axis
    )  # fmt: skip
    plot_h = height - fixed_h
    wave_h = int(plot_h * 0.4 / channels)
    spec_h = (plot_h - channels * wave_h) // channels

    # the values on the y axes, as many as the panels' heights leave room for
    x = audio.detach().float().cpu().numpy()
    peak = max(float(np.abs(x).max()), 1e-9)
    amp_ticks = [(peak, f"{peak:.2g}"), (0.0, "0"), (-peak, f"{-peak:.2g}")]
    if wave_h < 3 * text_h:
        amp_ticks = amp_ticks[::2] if wave_h >= 2 * text_h else amp_ticks[:1]
    freq_top = nyquist / freq_unit
    fvalues, flabels = _ticks(freq_top, max(1, min(4, spec_h // (2 * text_h))))
    db_values = [0, -20, -40, -60, -80]

    # the widths: axis names and tick labels on the left, the colour bar on the right
    y_tick_w = max(text_width(t, s) for t in [lab for _, lab in amp_ticks] + flabels)
    left = pad + text_h + pad + y_tick_w + tick_len + gap
    bar_w = 6 * s
    db_tick_w = max(text_width(str(v), s) for v in db_values)
    right = 2 * pad + bar_w + tick_len + gap + db_tick_w + pad + text_h + pad
    plot_w = width - left - right
    if plot_w < 16 or wave_h < 4 or spec_h < 4:
        need_w, need_h = left + right + 16, fixed_h + channels * 8
        raise ValueError(
            f"the picture must be at least {need_w} x {need_h} pixels to hold {channels} "
            f"channels' panels and their labels, got {width} x {height}"
        )

    canvas = _Canvas(width, height, s)
    y = pad
    for text in title_lines:
        canvas.text(text, "title", width // 2, y, "mt", colour=_TITLE_COLOUR)
        y += line
    y += pad
    x0, x1 = left, left + plot_w

    def channel_label(name: str, top: int) -> None:
        canvas.text(name, "channel", x0 + gap, top + gap, "lt", box=_LABEL_BOX)

    def group_axes(top: int, bottom: int, names: Sequence[str]) -> int:
        """The time axis under a group of panels and the name of its y axis at the left."""
        room = bottom - top
        name = _fitting(names, room, s)
        canvas.text(name, "y-label", pad, (top + bottom) // 2, "lm", vertical=True)
        values, labels = _ticks(
            duration, max(1, plot_w // (9 * 6 * s)), integer=sample_rate is None
        )
        for value, label in zip(values, labels):
            tx = x0 + round(value / duration * (plot_w - 1))
            canvas.vline(tx, bottom + 1, bottom + 1 + tick_len)
            canvas.text(label, "x-tick", tx, bottom + 1 + tick_len + gap, "mt")
        name = _fitting(time_names, plot_w, s)
        label_y = bottom + 1 + tick_len + gap + text_h + gap
        canvas.text(name, "x-label", (x0 + x1) // 2, label_y, "mt")
        return bottom + 1 + axis_h

    # the waveforms
    wave_top = y
    for c in range(channels):
        colour = _WAVE_COLOURS[c % len(_WAVE_COLOURS)]
        canvas.image[y : y + wave_h, x0:x1] = _waveform(x[c], peak, plot_w, wave_h, colour)
        canvas.frame(x0, y, x1, y + wave_h)
        for value, label in amp_ticks:
            ty = y + _amplitude_row(value, peak, wave_h)
            canvas.hline(x0 - 1 - tick_len, x0 - 1, ty)
            canvas.text(label, "y-tick", x0 - 1 - tick_len - gap, ty, "rm")
        channel_label(names[c], y)
        y += wave_h + (panel_gap if c < channels - 1 else 0)
    y = group_axes(wave_top, y, ["amplitude", "ampl."]) + 2 * pad

    # the spectrograms, one colour scale for all
    spec_top = y
    levels = _spectrograms(x, plot_w, spec_h)
    for c in range(channels):
        canvas.image[y : y + spec_h, x0:x1] = _palette(levels[c])
        canvas.frame(x0, y, x1, y + spec_h)
        for value, label in zip(fvalues, flabels):
            ty = y + spec_h - 1 - round(value / freq_top * (spec_h - 1))
            canvas.hline(x0 - 1 - tick_len, x0 - 1, ty)
            canvas.text(label, "y-tick", x0 - 1 - tick_len - gap, ty, "rm")
        channel_label(names[c], y)
        y += spec_h + (panel_gap if c < channels - 1 else 0)
    spec_bottom = y
    group_axes(spec_top, spec_bottom, freq_names)

    # the colour bar beside the spectrograms: the loudest bin (0 dB) at the top
    bar_x = x1 + 2 * pad
    bar_h = spec_bottom - spec_top
    ramp = np.linspace(1.0, 0.0, bar_h)[:, None].repeat(bar_w, axis=1)
    canvas.image[spec_top:spec_bottom, bar_x : bar_x + bar_w] = _palette(ramp)
    canvas.frame(bar_x, spec_top, bar_x + bar_w, spec_bottom)
    for value in db_values:
        ty = spec_top + round(-value / _DB_RANGE * (bar_h - 1))
        canvas.hline(bar_x + bar_w + 1, bar_x + bar_w + 1 + tick_len, ty)
        canvas.text(str(value), "colorbar-tick", bar_x + bar_w + 1 + tick_len + gap, ty, "lm")
    bar_label = _fitting(["level (dB below the loudest bin)", "dB below loudest", "dB"], bar_h, s)
    label_x, label_y = width - pad - text_h, (spec_top + spec_bottom) // 2
    canvas.text(bar_label, "colorbar-label", label_x, label_y, "lm", vertical=True)
    return AudioFigure(canvas.image, heading, canvas.texts)


def audio_picture(
    audio: torch.Tensor,
    *,
    width: int = 1200,
    height: int = 720,
    sample_rate: float | None = None,
    title: str | None = None,
    channel_names: Sequence[str] | None = None,
) -> np.ndarray:
    """The ``(height, width, 3)`` uint8 pixels of :func:`audio_figure`."""
    return audio_figure(
        audio, width=width, height=height, sample_rate=sample_rate, title=title,
        channel_names=channel_names,
    ).image  # fmt: skip


def write_audio_picture(
    audio: torch.Tensor,
    path: str | Path,
    *,
    width: int = 1200,
    height: int = 720,
    sample_rate: float | None = None,
    title: str | None = None,
    channel_names: Sequence[str] | None = None,
) -> Path:
    """Write :func:`audio_figure` of ``audio`` to ``path`` as a PNG."""
    path = Path(path)
    image = audio_picture(
        audio, width=width, height=height, sample_rate=sample_rate, title=title,
        channel_names=channel_names,
    )  # fmt: skip
    path.write_bytes(png_bytes(image))
    return path
