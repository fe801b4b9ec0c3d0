"""WAV encoding and the waveform/spectrogram picture."""

import io
import struct
import wave
import zlib

import numpy as np
import pytest
import torch

from stream_dit.picture import audio_picture, png_bytes, write_audio_picture
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
    data = wav_bytes(audio, 800)
    header = wav_header(10, 2, 800)
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
