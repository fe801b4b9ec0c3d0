"""The session's decoder stage: finished latents come back as audio equal to a full decode."""

import asyncio

import pytest
import torch

pytest.importorskip("diffusers")

from decode_test_helpers import full_decode, tiny_decoder

from conftest import cond
from stream_dit import Request, StreamSession, TorchEngine, warmup
from stream_dit.aio import AsyncStreamSession, RequestFailed
from stream_dit.decode import AudioDecoder, DecoderEngine

EXACT = 1e-5  # float32, context = the receptive field: rounding only


@pytest.fixture(scope="module")
def adapter():
    return tiny_decoder()[1]


def _session(model, adapter, *, depth=3, **decoder_kwargs):
    kwargs = {"window": 32, "batch_windows": 3, **decoder_kwargs}
    engine = DecoderEngine(adapter, max_batch=kwargs.pop("batch_windows"))
    decoder = AudioDecoder(engine, **kwargs)
    dit = TorchEngine(model, max_batch=2 * depth, max_frames=128, max_cond_len=8)
    return StreamSession(model, dit, depth=depth, decoder=decoder)


def test_session_decodes_finished_latents_in_batched_windows(tiny_model, adapter, seed):
    """Requests shorter than a window, of several windows, and one without audio: each audio
    equals the full decode of its latent, grows in order, and windows of different requests
    share decoder calls."""
    session = _session(tiny_model, adapter)
    gen = torch.Generator().manual_seed(seed)
    lengths = [20, 75, 33, 90, 75]
    handles = [
        session.submit(Request(frames=n, cond=cond(gen, 3), seed=seed + i, steps=2))
        for i, n in enumerate(lengths)
    ]
    quiet = session.submit(Request(frames=40, cond=cond(gen, 3), steps=2, audio=False))
    seen = {h.id: [] for h in handles}
    for h in handles:
        h.add_listener(lambda h: seen[h.id].append(h.audio_samples))
    session.run_until_idle()
    assert session.idle and session.decoder.idle
    for h, n in zip(handles, lengths):
        assert h.audio_done and h.audio.shape == (2, n * 32) and h.audio_error is None
        ref = full_decode(adapter, h.result)
        err = (h.audio - ref).abs().max() / ref.abs().max()
        assert err <= EXACT, f"frames={n}: relative error {err:.2e}"
        assert seen[h.id] == sorted(seen[h.id]) and seen[h.id][-1] == n * 32
    assert quiet.audio is None and not quiet.audio_done and quiet.result is not None
    windows = sum(session.decoder.plan(n).windows for n in lengths)
    assert session.decoder.windows_decoded == windows
    assert session.decoder.calls < windows  # batched across requests


def test_cancel_stops_decoding_and_bounded_steps(tiny_model, adapter, seed):
    """One window per step: a cancelled request stops being decoded, the others finish."""
    session = _session(tiny_model, adapter, depth=2, max_windows_per_step=1)
    gen = torch.Generator().manual_seed(seed)
    a = session.submit(Request(frames=100, cond=cond(gen, 2), steps=1))
    b = session.submit(Request(frames=100, cond=cond(gen, 2), steps=1, seed=1))
    session.tick()  # both latents finish; one window of `a` is decoded
    assert a.audio_pending and 0 < a.audio_samples < a.audio.shape[-1]
    assert b.audio_pending and b.audio_samples == 0
    b.cancel()  # queued behind `a`
    session.tick()
    a.cancel()  # partly decoded
    session.run_until_idle()
    assert a.audio_error is not None and b.audio_error is not None
    assert not a.audio_done and not b.audio_done and session.idle
    c = session.submit(Request(frames=40, cond=cond(gen, 2), steps=1))
    session.run_until_idle()
    assert c.audio_done


def test_async_generate_audio_and_stream_audio(tiny_model, adapter, seed):
    session = _session(tiny_model, adapter, depth=2)
    gen = torch.Generator().manual_seed(seed)
    c = cond(gen, 3)

    async def main():
        async with AsyncStreamSession(session) as driver:
            whole = await driver.generate_audio(Request(frames=70, cond=c, seed=3, steps=2))
            pieces = [
                p async for p in driver.stream_audio(Request(frames=70, cond=c, seed=3, steps=2))
            ]
            latent = await driver.generate(Request(frames=70, cond=c, seed=3, steps=2))
            with pytest.raises(ValueError, match="audio is False"):
                await driver.generate_audio(Request(frames=8, cond=c, audio=False))
            return whole, pieces, latent

    whole, pieces, latent = asyncio.run(main())
    # pieces end on window seams; those finished between two looks of the loop come together
    assert 1 <= len(pieces) <= session.decoder.plan(70).windows
    torch.testing.assert_close(torch.cat(pieces, dim=-1), whole, rtol=0, atol=0)
    ref = full_decode(adapter, latent)
    assert (whole - ref).abs().max() / ref.abs().max() <= EXACT


def test_no_decoder_means_latents_only(tiny_model):
    session = StreamSession(tiny_model, depth=1)
    h = session.submit(Request(frames=8, cond=torch.randn(2, 32), steps=1))
    session.run_until_idle()
    assert h.result is not None and h.audio is None and not h.audio_pending

    async def main():
        async with AsyncStreamSession(session) as driver:
            await driver.generate_audio(Request(frames=8, cond=torch.randn(2, 32)))

    with pytest.raises(ValueError, match="no decoder"):
        asyncio.run(main())


def test_warmup_runs_the_decoder(tiny_model, adapter):
    session = _session(tiny_model, adapter, depth=1)
    report = warmup(session, frames=16, cond_lens=2, cfg=False)
    assert report.decoder_calls == 3  # batch buckets 1, 2, 3 of an eager engine
    assert "audio decoder calls" in str(report)
    assert session.decoder.idle and session.decoder.calls == 0


def test_bad_decoder_arguments(tiny_model, adapter):
    with pytest.raises(ValueError, match="window=20 must exceed"):
        AudioDecoder(adapter, window=20)
    with pytest.raises(ValueError, match="batch_windows"):
        AudioDecoder(DecoderEngine(adapter, max_batch=2), batch_windows=3)
    with pytest.raises(ValueError, match="max_windows_per_step"):
        AudioDecoder(adapter, max_windows_per_step=0)
    with pytest.raises(TypeError, match="engine must be"):
        AudioDecoder("vae")
    with pytest.raises(ValueError, match="mode"):
        DecoderEngine(adapter, mode="fast")
    with pytest.raises(ValueError, match="needs the decoder on a CUDA device"):
        DecoderEngine(adapter, mode="graphs")
    with pytest.raises(ValueError, match="z must be"):
        DecoderEngine(adapter)(torch.zeros(1, 3, 8))
    with pytest.raises(TypeError, match="decoder must be an AudioDecoder"):
        StreamSession(tiny_model, depth=1, decoder=adapter)
    with pytest.raises(TypeError, match="audio must be a bool"):
        StreamSession(tiny_model, depth=1).submit(
            Request(frames=4, cond=torch.randn(1, 32), audio="yes")
        )


def test_failed_decoder_call_fails_only_the_audio(tiny_model, adapter):
    class Broken(DecoderEngine):
        def forward(self, z):
            raise RuntimeError("decoder out of memory")

    decoder = AudioDecoder(Broken(adapter, max_batch=2), window=32)
    session = StreamSession(tiny_model, depth=1, decoder=decoder)
    h = session.submit(Request(frames=40, cond=torch.randn(2, 32), steps=1))
    session.run_until_idle()
    assert h.result is not None and "out of memory" in str(h.audio_error)
    assert session.idle

    async def main():
        async with AsyncStreamSession(session) as driver:
            await driver.generate_audio(Request(frames=8, cond=torch.randn(2, 32), steps=1))

    with pytest.raises(RequestFailed, match="decoding failed"):
        asyncio.run(main())
