"""WAV encoding and the waveform/spectrogram picture."""

import io
import struct
import wave
import zlib

import numpy as np
import pytest
import torch

from stream_dit.picture import audio_figure, audio_picture, png_bytes, write_audio_picture
from stream_dit.wav import peak_normalize, wav_bytes, wav_header


def test_pcm16_wav_reads_back_with_the_wave_module():
    audio = torch.tensor([[0.0, 0.5, -0.5, 2.0], [1.0, -1.0, 0.25, -3.0]])
    data = wav_bytes(audio, 48_000, "pcm16")
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getframerate(), w.getsampwidth(), w.getnframes()) == (
            2, 48_000, 2, 4,
        )  # fmt: skip
        frames = np.frombuffer(w.readframes(4), "<i2").reshape(4, 2).T
    np.testing.assert_array_equal(frames[0], [0, 16384, -16384, 32767])  # clipped to [-1, 1]
    np.testing.assert_array_equal(frames[1], [32767, -32767, 8192, -32767])


def test_float_wav_header_states_the_final_size():
    audio = torch.randn(2, 10)
    data = wav_bytes(audio, 800, "f32")
    header = wav_header(10, 2, 800, "f32")
    assert data.startswith(header) and len(data) == len(header) + 10 * 2 * 4
    assert struct.unpack("<I", data[4:8])[0] == len(data) - 8
    assert struct.unpack("<H", header[20:22])[0] == 3  # IEEE float
    np.testing.assert_array_equal(
        np.frombuffer(data[len(header) :], "<f4").reshape(10, 2).T, audio.numpy()
    )


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: wav_header(10, 2, 800, "mp3"), "format"),
        (lambda: wav_header(-1, 2, 800), "samples"),
        (lambda: wav_header(10, 0, 800), "channels"),
        (lambda: wav_header(10, 2, 0), "sample_rate"),
        (lambda: wav_bytes(torch.zeros(5), 800), "audio"),
        (lambda: audio_picture(torch.zeros(2, 1)), "audio"),
        (lambda: audio_picture(torch.zeros(2, 100), width=4), "pixels"),
        (lambda: png_bytes(np.zeros((4, 4), np.uint8)), "rgb"),
    ],
)
def test_bad_inputs_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_peak_normalize_and_picture(tmp_path):
    t = torch.linspace(0, 1, 4000)
    audio = torch.stack([3 * torch.sin(2 * torch.pi * 60 * t), torch.sin(2 * torch.pi * 300 * t)])
    assert abs(float(peak_normalize(audio).abs().max()) - 10 ** (-1 / 20)) < 1e-6
    path = write_audio_picture(audio, tmp_path / "a.png", width=200, height=120)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (200, 120)
    idat = data.index(b"IDAT")
    size = struct.unpack(">I", data[idat - 4 : idat])[0]
    raw = zlib.decompress(data[idat + 4 : idat + 4 + size])
    assert len(raw) == height * (1 + 3 * width)


def _png_pixels(data: bytes) -> np.ndarray:
    """The RGB pixels of a PNG as :func:`png_bytes` writes it (one IDAT chunk, no filters)."""
    width, height = struct.unpack(">II", data[16:24])
    idat = data.index(b"IDAT")
    size = struct.unpack(">I", data[idat - 4 : idat])[0]
    raw = np.frombuffer(zlib.decompress(data[idat + 4 : idat + 4 + size]), np.uint8)
    return raw.reshape(height, 1 + 3 * width)[:, 1:].reshape(height, width, 3)


def _drawn(figure, text) -> bool:
    """Some pixel of the text's box has a colour of the font (not of a panel or the background)."""
    x0, y0, x1, y1 = text.box
    region = figure.image[y0:y1, x0:x1].reshape(-1, 3)
    return any((region == colour).all(axis=1).any() for colour in ((220, 220, 230), (255,) * 3))


def test_picture_names_what_it_shows_with_axes_units_channels_and_a_db_colour_bar(tmp_path):
    t = torch.arange(1600) / 800
    audio = torch.stack([torch.sin(2 * torch.pi * 50 * t), 0.5 * torch.sin(2 * torch.pi * 200 * t)])
    kwargs = {"sample_rate": 800, "title": "stream-dit demo: a test clip"}
    figure = audio_figure(audio, **kwargs)
    path = write_audio_picture(audio, tmp_path / "clip.png", **kwargs)
    # the file holds the figure whose texts are checked below
    np.testing.assert_array_equal(_png_pixels(path.read_bytes()), figure.image)
    assert figure.image.shape == (720, 1200, 3)

    title = " ".join(figure.strings("title")).replace("\N{NO-BREAK SPACE}", " ")
    assert title.startswith("stream-dit demo: a test clip")
    assert "2.00 s" in title and "stereo" in title and "800 Hz sample rate" in title
    # each of the two groups (waveforms, spectrograms) has a labelled time axis in seconds
    assert figure.strings("x-label") == ["time (s)", "time (s)"]
    ticks = figure.strings("x-tick")
    assert ticks.count("0.0") == 2 and ticks.count("2.0") == 2 and len(ticks) >= 6
    assert figure.strings("y-label") == ["amplitude", "frequency (Hz)"]
    assert "0" in figure.strings("y-tick") and "400" in figure.strings("y-tick")  # Nyquist
    assert figure.strings("channel") == ["left", "right", "left", "right"]
    assert "dB" in figure.strings("colorbar-label")[0]
    assert figure.strings("colorbar-tick") == ["0", "-20", "-40", "-60", "-80"]
    for text in figure.texts:
        assert _drawn(figure, text), text
    # the waveforms' time axis lies above the spectrograms, the spectrograms' below them
    wave_axis, spec_axis = (t for t in figure.texts if t.role == "x-label")
    nyquist = [t.box[1] for t in figure.texts if t.role == "y-tick" and t.text == "400"]
    assert len(nyquist) == 2 and wave_axis.box[3] < min(nyquist) < max(nyquist) < spec_axis.box[1]


def test_picture_axes_in_khz_and_samples_and_channel_names():
    audio = torch.randn(1, 4800)
    figure = audio_figure(audio, sample_rate=48_000, width=800, height=500)
    assert figure.strings("y-label") == ["amplitude", "frequency (kHz)"]
    assert "24" in figure.strings("y-tick") or "20" in figure.strings("y-tick")
    assert figure.strings("channel") == ["mono", "mono"]
    assert "48 kHz sample rate" in figure.title.replace("\N{NO-BREAK SPACE}", " ")

    bare = audio_figure(torch.randn(3, 500), channel_names=["a", "b", "c"])
    assert bare.strings("channel") == ["a", "b", "c"] * 2
    assert bare.strings("x-label") == ["time (samples)"] * 2
    assert "500 samples" in bare.title and "no sample rate" in bare.title
    assert audio_figure(torch.randn(3, 500)).strings("channel")[:3] == [
        "channel 1", "channel 2", "channel 3",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="channel_names"):
        audio_figure(audio, channel_names=["left", "right"])
    with pytest.raises(ValueError, match="sample_rate"):
        audio_figure(audio, sample_rate=0)


def test_a_long_title_wraps_and_every_text_stays_inside_the_picture():
    figure = audio_figure(
        torch.randn(2, 3000), sample_rate=44_100, width=640, height=400, title="word " * 120
    )
    assert 1 < len(figure.strings("title")) <= 400 // (8 * 11)
    assert figure.strings("title")[-1].endswith("…")
    h, w = figure.image.shape[:2]
    for text in figure.texts:
        x0, y0, x1, y1 = text.box
        assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h, text


def test_the_font_draws_every_printable_ascii_character_apart():
    from stream_dit.bitmap_font import _GLYPHS

    chars = [chr(c) for c in range(33, 127)]
    assert all(_GLYPHS[c].shape == (9, 5) and _GLYPHS[c].any() for c in chars)
    assert len({_GLYPHS[c].tobytes() for c in chars}) == len(chars)
    assert not _GLYPHS[" "].any()
