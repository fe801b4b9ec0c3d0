"""The audio decoder on CUDA: ACE-Step 1.5's published VAE in bf16, windowed against the full
decode, the CUDA-graph and compiled engines against eager, and the decoder's own stream."""

import pytest
import torch

pytest.importorskip("diffusers")

from test_snake_conv import LAYERS, _layer, poisoned_outputs

from stream_dit import Request, StreamSession, TorchEngine, build_model
from stream_dit.decode import AudioDecoder, DecoderEngine, decode_windowed
from stream_dit.decode.fused import FusedOobleck
from stream_dit.decode.oobleck import OobleckAdapter, build_vae
from stream_dit.ops.snake_conv import snake_conv
from triton_dispatch.testing import assert_close

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


@pytest.mark.parametrize("mode", ["graphs", "compile", "compile-graphs", "fused", "fused-graphs"])
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


def test_fused_graph_holds_about_its_working_set(published):
    """The fused decoder's CUDA graph keeps one window's working set (four activations of the
    widest level and change), not one set of segments per level: at windows of 240 frames,
    1 per call, under a quarter of the full decode of 60 s (3868 MiB in bf16)."""
    _, adapter = published
    engine = DecoderEngine(adapter, max_batch=1, mode="fused-graphs", graph_lengths=(240,))
    assert engine.graph_memory_bytes() == 0
    with torch.no_grad():
        engine(_latent(240)[None])
    widest = 240 * 1920 * 128 * 2  # one activation at 48 kHz, 128 channels, bf16
    held = engine.graph_memory_bytes()
    assert 4 * widest < held < 7 * widest, held / widest
    assert held < 3868 * 2**20 / 4


def test_chunked_fused_decoder_holds_a_chunk_not_the_window(published):
    """Windows of 768 frames with the wide levels in chunks of 256: the audio of one pass (same
    kernels, same sums per sample: bf16 rounding at most) and a graph pool that follows the chunk,
    under a quarter of the full decode of 60 s."""
    _, adapter = published
    z = _latent(768)[None]
    with torch.no_grad():
        whole = FusedOobleck(adapter, chunk_frames=None)(z).float()
        engine = DecoderEngine(
            FusedOobleck(adapter, chunk_frames=256), max_batch=1, mode="fused-graphs",
            graph_lengths=(768,),
        )  # fmt: skip
        chunked = engine(z).float()
    err = float((chunked - whole).abs().max()) / float(whole.abs().max())
    assert err < 1e-2, err
    chunk = 256 * 1920 * 128 * 2  # one activation of a chunk at 48 kHz, 128 channels, bf16
    held = engine.graph_memory_bytes()
    assert 4 * chunk < held < 7 * chunk, held / chunk
    assert held < 3868 * 2**20 / 4


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


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_snake_conv_layers_in_bf16(monkeypatch, name):
    """Each epilogue of the layer kernel at GPU tile sizes, bf16 against the float64 spec."""
    taps, dil, cin, cout, phases, shift, pw, res, act, store, _ = LAYERS[name]
    wide = (
        taps,
        dil,
        cin * 8,
        min(cout * 8, 128) if pw else cout * 8,
        phases,
        shift,
        pw,
        res,
        act,
        store,
        700,
    )
    gen = torch.Generator().manual_seed(1)
    layer, ref_layer, x, r = _layer(gen, wide, torch.bfloat16, "cuda")
    poisoned_outputs(monkeypatch)
    x16 = x.to("cuda", torch.bfloat16)
    r16 = None if r is None else r.to("cuda", torch.bfloat16)
    got = snake_conv(x16, layer, residual=r16)
    want = snake_conv(
        x16.double().cpu(), ref_layer, residual=None if r16 is None else r16.double().cpu()
    )
    for g, w in zip(got, want):
        if w is not None:
            assert_close(g, w, tol=1e-2)


@pytest.mark.parametrize("head", [(7, 2, 1), (3, 1, 2)])
def test_snake_conv_head_in_bf16(monkeypatch, head):
    """A 128-channel unit with the decoder's last convolution folded in (GPU tiles, many row
    tiles, bf16) against the float64 spec."""
    unit = (7, 3, 128, 128, 1, 0, True, True, True, False, 700)
    gen = torch.Generator().manual_seed(2)
    layer, ref_layer, x, r = _layer(gen, unit, torch.bfloat16, "cuda", head=head)
    poisoned_outputs(monkeypatch)
    x16, r16 = x.to("cuda", torch.bfloat16), r.to("cuda", torch.bfloat16)
    _, audio = snake_conv(x16, layer, residual=r16)
    _, want = snake_conv(x16.double().cpu(), ref_layer, residual=r16.double().cpu())
    assert audio.shape == (2, 700, head[1])
    assert_close(audio, want, tol=1e-2)


def test_fused_decoder_is_closer_to_float32_than_the_bf16_adapter(published):
    """The fused decoder's Snake runs in float32 on rounded activations: over the published VAE its
    bf16 decode must be no further from a float32 decode than diffusers' own bf16 decode."""
    _, adapter = published
    z = torch.stack([_latent(146, 3), _latent(146, 4)])
    exact = OobleckAdapter(build_vae("ace-step", seed=0, device="cuda", dtype=torch.float32))
    with torch.no_grad(), torch.backends.cudnn.flags(allow_tf32=False):
        want = exact(z.float())
        peak = float(want.abs().max())
        fused_err = float((FusedOobleck(adapter)(z).float() - want).abs().max()) / peak
        adapter_err = float((adapter(z).float() - want).abs().max()) / peak
    assert fused_err < 3e-2 and fused_err <= 1.1 * adapter_err, (fused_err, adapter_err)
