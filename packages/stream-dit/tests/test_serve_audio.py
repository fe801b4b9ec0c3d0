"""``POST /generate/audio`` and ``/generate/audio/stream``: WAV audio from the server, with the
latent endpoint unchanged."""

import io
import json
import struct
import wave

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
pytest.importorskip("diffusers")

from decode_test_helpers import full_decode, tiny_decoder  # noqa: E402
from serve_test_helpers import serving  # noqa: E402

from stream_dit import StreamSession, TorchEngine  # noqa: E402
from stream_dit.decode import AudioDecoder, DecoderEngine  # noqa: E402
from stream_dit.server import create_app  # noqa: E402


def read_wav(data: bytes) -> tuple[int, np.ndarray]:
    """(sample rate, (channels, n) float32) of a WAV this server writes."""
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    assert struct.unpack("<I", data[4:8])[0] == len(data) - 8
    pos, fmt = 12, None
    while pos < len(data):
        kind, size = data[pos : pos + 4], struct.unpack("<I", data[pos + 4 : pos + 8])[0]
        body = data[pos + 8 : pos + 8 + size]
        if kind == b"fmt ":
            fmt = struct.unpack("<HHIIHH", body[:16])
        elif kind == b"data":
            tag, channels, rate = fmt[0], fmt[1], fmt[2]
            dtype = "<f4" if tag == 3 else "<i2"
            x = np.frombuffer(body, dtype=dtype).reshape(-1, channels).T.astype(np.float32)
            return rate, x if tag == 3 else x / 32767.0
        pos += 8 + size
    raise AssertionError("no data chunk")


@pytest.fixture(scope="module")
def server(tiny_model):
    adapter = tiny_decoder()[1]
    decoder = AudioDecoder(DecoderEngine(adapter, max_batch=2), window=32)
    engine = TorchEngine(tiny_model, max_batch=4, max_frames=64, max_cond_len=8)
    session = StreamSession(tiny_model, engine, depth=2, decoder=decoder)
    with serving(create_app(session, warmup=False)) as url:
        yield url, adapter


def _post(url, path, body, **params):
    with httpx.Client(timeout=60) as client:
        return client.post(
            f"{url}{path}",
            params=params,
            content=json.dumps(body),
            headers={"content-type": "application/json"},
        )


def test_wav_and_stream_equal_the_decoded_latent(server):
    url, adapter = server
    body = {"frames": 60, "cond_seed": 4, "cond_len": 3, "seed": 2, "steps": 2}
    latent = np.load(io.BytesIO(_post(url, "/generate", body).content))
    ref = full_decode(adapter, torch.from_numpy(latent)).numpy()
    whole = _post(url, "/generate/audio", body, format="f32")
    assert whole.status_code == 200 and whole.headers["content-type"] == "audio/wav"
    rate, audio = read_wav(whole.content)
    assert rate == 800 and audio.shape == (2, 60 * 32)
    np.testing.assert_allclose(audio, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    with httpx.Client(timeout=60) as client, client.stream(
        "POST", f"{url}/generate/audio/stream?format=f32", content=json.dumps(body),
        headers={"content-type": "application/json"},
    ) as resp:  # fmt: skip
        assert resp.status_code == 200
        chunks = list(resp.iter_bytes())
    streamed = b"".join(chunks)
    assert streamed == whole.content  # the streamed file is the same file
    _, pcm = read_wav(_post(url, "/generate/audio", body, format="pcm16", normalize="1").content)
    assert abs(np.abs(pcm).max() - 10 ** (-1 / 20)) < 1e-3  # -1 dBFS peak
    # the default is 16-bit PCM, which the standard library's reader (and every tool) opens
    default = _post(url, "/generate/audio", body).content
    with wave.open(io.BytesIO(default)) as w:
        assert (w.getsampwidth(), w.getnchannels(), w.getnframes()) == (2, 2, 60 * 32)
    _, clipped = read_wav(default)
    np.testing.assert_allclose(clipped, np.clip(ref, -1, 1), rtol=0, atol=1.5 / 32767)


def test_audio_endpoints_refuse_bad_queries_and_bodies(server, tiny_model):
    url, _ = server
    body = {"frames": 8, "cond_seed": 0, "cond_len": 2}
    assert _post(url, "/generate/audio", body, format="mp3").status_code == 422
    assert _post(url, "/generate/audio", body, volume="11").status_code == 422
    assert _post(url, "/generate/audio/stream", body, normalize="1").status_code == 422
    assert _post(url, "/generate/audio", {**body, "frames": 500}).status_code == 400
    plain = StreamSession(tiny_model, depth=1)
    with serving(create_app(plain, warmup=False)) as bare:
        resp = _post(bare, "/generate/audio", body)
        assert resp.status_code == 404 and "no audio decoder" in resp.text
