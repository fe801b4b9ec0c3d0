"""The audio decoder on CUDA: ACE-Step 1.5's published VAE in bf16, windowed against the full
decode, the CUDA-graph and compiled engines against eager, and the decoder's own stream."""

import pytest
import torch

pytest.importorskip("diffusers")

from stream_dit import Request, StreamSession, TorchEngine, build_model
from stream_dit.decode import AudioDecoder, DecoderEngine, decode_windowed
from stream_dit.decode.oobleck import OobleckAdapter, build_vae

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def published():
    vae = build_vae("ace-step", seed=0, device="cuda", dtype=torch.bfloat16)
    return vae, OobleckAdapter(vae)


def _latent(frames, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(64, frames, generator=gen).to("cuda", torch.bfloat16)


def test_published_windowed_decode_matches_full_decode_in_bf16(published):
    """20 s of audio in 128-frame windows against ``vae.decode``: bf16 rounding only (the
    summation order of the convolutions differs), at the seams as elsewhere."""
    vae, adapter = published
    z = _latent(500)
    with torch.no_grad():
        ref = vae.decode(z[None]).sample[0].float()
        out = decode_windowed(adapter, z, hop=1920, window=128, context=9, crossfade=1, batch=2)
    err = float((out - ref).abs().max()) / float(ref.abs().max())
    assert out.shape == ref.shape and err < 3e-2, err


@pytest.mark.parametrize("mode", ["graphs", "compile", "compile-graphs"])
def test_engines_match_eager(published, mode):
    _, adapter = published
    eager = DecoderEngine(adapter, max_batch=2)
    other = DecoderEngine(adapter, max_batch=2, mode=mode, graph_lengths=(64,))
    z = torch.stack([_latent(64, 1), _latent(64, 2)])
    for batch in (2, 1, 2):  # replays reuse the output buffer: each call is checked fresh
        want, got = eager(z[:batch]).float(), other(z[:batch]).float().clone()
        assert float((got - want).abs().max()) <= 3e-2 * float(want.abs().max())
    short = _latent(40)[None]  # not a graph length: runs without a graph
    torch.testing.assert_close(other(short).float(), eager(short).float(), atol=5e-2, rtol=5e-2)


def test_session_decodes_on_its_own_stream_while_ticking(published):
    _, adapter = published
    model = build_model("small", seed=0, device="cuda", dtype=torch.bfloat16)
    engine = TorchEngine(model, max_batch=8, max_frames=512, mode="graphs")
    decoder = AudioDecoder(
        DecoderEngine(adapter, max_batch=2, mode="graphs", graph_lengths=(128,)), window=128
    )
    session = StreamSession(model, engine, depth=4, decoder=decoder)
    assert decoder.stream is not None and decoder.stream != torch.cuda.current_stream()
    gen = torch.Generator().manual_seed(0)
    handles = [
        session.submit(Request(frames=300 + 7 * i, cond=torch.randn(4, 256, generator=gen),
                               seed=i, steps=3 + i % 2))
        for i in range(6)
    ]  # fmt: skip
    session.run_until_idle()
    for h in handles:
        assert h.audio_done and h.audio.is_pinned()
        with torch.no_grad():
            ref = adapter(h.result.t()[None].to(torch.bfloat16))[0].float().cpu()
        assert float((h.audio - ref).abs().max()) <= 3e-2 * float(ref.abs().max())
