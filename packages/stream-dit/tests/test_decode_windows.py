"""Windowed decoding equals the full decode: the receptive field, the window plan, the stitch."""

import pytest
import torch

pytest.importorskip("diffusers")

from decode_test_helpers import THREE_BLOCKS, TINY, tiny_decoder

from stream_dit.decode import decode_windowed, oobleck_receptive_field, plan_windows
from stream_dit.decode.oobleck import VAE_PRESETS, OobleckAdapter

# float32 on the host: a window whose context covers the receptive field differs from the full
# decode only by the summation order of its convolutions
EXACT = 1e-5


@pytest.fixture(scope="module")
def tiny():
    return tiny_decoder(TINY)


@pytest.mark.parametrize("preset", [TINY, THREE_BLOCKS], ids=["tiny", "three-blocks"])
def test_receptive_field_is_the_reach_of_a_perturbed_frame(preset, seed):
    """The walked bound equals how far a change of one latent frame reaches, sample for sample
    (in float64: in float32 the farthest effects are lost in rounding)."""
    _, adapter = tiny_decoder(preset, seed)
    adapter = adapter.double()
    rf = adapter.receptive_field
    gen = torch.Generator().manual_seed(seed)
    frames, i, hop = 3 * rf.context_frames() + 4, rf.context_frames() + 2, rf.hop
    z = torch.randn(1, adapter.latent_channels, frames, generator=gen, dtype=torch.float64)
    z2 = z.clone()
    z2[0, :, i] += 5 * torch.randn(adapter.latent_channels, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        changed = torch.nonzero((adapter(z2) - adapter(z)).abs().amax(dim=(0, 1))).flatten()
    assert i * hop - int(changed.min()) == rf.left
    assert int(changed.max()) - ((i + 1) * hop - 1) == rf.right


def test_published_configurations():
    """ACE-Step 1.5's VAE: 48 kHz, hop 1920 (25 Hz latents), 9 frames of context; Stable
    Audio's: 44.1 kHz, hop 2048, 10 frames (built on the meta device: no weights drawn)."""
    from diffusers import AutoencoderOobleck

    expected = {"ace-step": (1920, 48_000, 16005, 9), "stable-audio": (2048, 44_100, 18981, 10)}
    for name, (hop, rate, depth, context) in expected.items():
        with torch.device("meta"):
            vae = AutoencoderOobleck(**VAE_PRESETS[name].kwargs())
        rf = oobleck_receptive_field(vae.decoder)
        assert (rf.hop, vae.config.sampling_rate, rf.left, rf.right) == (hop, rate, depth, depth)
        assert rf.context_frames() == context
        assert vae.config.decoder_input_channels == 64 and vae.config.audio_channels == 2


def test_adapter_equals_vae_decode_and_leaves_the_vae_alone(tiny, seed):
    vae, adapter = tiny
    z = torch.randn(2, 64, 23, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ref = vae.decode(z).sample
        out = adapter(z)
    assert out.shape == (2, 2, 23 * 32)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert hasattr(vae.decoder.conv1, "weight_g")  # the VAE keeps its weight norm
    assert not hasattr(adapter.decoder.conv1, "weight_g")
    with pytest.raises(TypeError, match="vae must be an AutoencoderOobleck"):
        OobleckAdapter(adapter.decoder)


@pytest.mark.parametrize(
    "frames,window,crossfade,batch,align",
    [
        (17, 32, 1, 1, 0),
        (33, 32, 1, 2, 0),
        (90, 32, 0, 3, 0),
        (97, 40, 3, 2, 0),
        (150, 48, 1, 4, 0),
        (97, 40, 3, 2, 8),
        (150, 48, 1, 4, 16),
    ],
)
def test_windowed_decode_equals_full_decode(tiny, seed, frames, window, crossfade, batch, align):
    """With the derived context, every sample (seams included) equals the full decode."""
    _, adapter = tiny
    context = adapter.receptive_field.context_frames()
    z = torch.randn(64, frames, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ref = adapter(z[None])[0]
        out = decode_windowed(
            adapter, z, hop=32, window=window, context=context, crossfade=crossfade,
            batch=batch, align=align,
        )  # fmt: skip
    assert out.shape == ref.shape and out.dtype == torch.float32
    err = (out - ref).abs().max() / ref.abs().max()
    assert err <= EXACT, f"relative error {err:.2e}"


def test_seam_error_shrinks_with_context_and_stays_at_the_seams(tiny, seed):
    """Below the receptive field the error lives within it of a seam and falls with the context;
    at the derived context it is rounding."""
    _, adapter = tiny
    rf = adapter.receptive_field
    z = torch.randn(64, 160, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ref = adapter(z[None])[0]
    peak = float(ref.abs().max())
    errors = []
    for context in (0, 4, 8, rf.context_frames()):
        plan = plan_windows(160, 40, context, 1)
        with torch.no_grad():
            out = decode_windowed(adapter, z, hop=32, window=40, context=context, crossfade=1)
        err = (out - ref).abs().amax(dim=0)
        near = torch.zeros_like(err, dtype=torch.bool)
        for k in range(1, plan.windows):
            # window k's first kept sample and window k−1's last one: within reach of an edge
            lo = plan.starts[k] * 32
            hi = (plan.starts[k - 1] + plan.length) * 32
            near[max(lo, 0) : min(hi + rf.left, near.numel())] = True
            near[max(lo - rf.right, 0) : hi] = True
        assert float(err[~near].max()) / peak <= EXACT
        errors.append(float(err.max()) / peak)
    assert errors[0] > errors[1] > errors[2] > errors[3]
    assert errors[3] <= EXACT


def test_plan_covers_the_latent_with_equal_windows():
    plan = plan_windows(1500, 128, 9, 1)
    assert plan.length == 128 and all(s + 128 <= 1500 for s in plan.starts)
    assert plan.starts[0] == 0 and plan.starts[-1] == 1500 - 128
    finals = [plan.final_frames(k) for k in range(plan.windows)]
    assert finals == sorted(finals) and finals[-1] == 1500
    for k in range(1, plan.windows):  # window k is exact from where it takes over
        assert plan.starts[k] + 9 <= plan.seams[k - 1] - 1
    single = plan_windows(100, 128, 9, 1)
    assert single.windows == 1 and single.length == 100 and single.crossfade == 0


@pytest.mark.parametrize("align", [1, 8, 16])
def test_aligned_windows_are_the_shortest_multiple_that_needs_no_more(align):
    for frames in (129, 300, 777, 1500, 4000):
        for window, context, crossfade in ((128, 9, 1), (256, 9, 1), (64, 4, 0)):
            full = plan_windows(frames, window, context, crossfade)
            plan = plan_windows(frames, window, context, crossfade, align=align)
            assert plan.windows == full.windows
            if plan.windows == 1:  # a latent no longer than a window is decoded whole
                assert plan.length == frames
                continue
            assert plan.length % align == 0 or plan.length == window
            assert plan.length <= window
            assert plan.starts[0] == 0 and plan.starts[-1] == frames - plan.length
            assert list(plan.starts) == sorted(plan.starts)
            for k in range(1, plan.windows):  # window k is exact from where it takes over
                assert plan.starts[k] + context <= plan.seams[k - 1] - crossfade
            shorter = plan.length - align
            if shorter > 2 * context + crossfade:  # one multiple less would need more windows
                assert plan_windows(frames, shorter, context, crossfade).windows > plan.windows
    assert plan_windows(1500, 256, 9, 1, align=16).length == 240  # 7 windows: 1680, not 1792
    assert plan_windows(100, 128, 9, 1, align=16).length == 100  # one window: the latent's own


def test_window_lengths_lists_what_aligned_plans_give():
    from stream_dit.decode import window_lengths

    assert window_lengths(128) == (128,)
    assert window_lengths(40, 16) == (16, 32, 40)
    for frames in range(41, 400, 7):
        assert plan_windows(frames, 40, 4, 1, align=16).length in window_lengths(40, 16)


@pytest.mark.parametrize(
    "args,match",
    [
        ((0, 32, 4, 1), "frames"),
        ((10, 0, 4, 1), "window"),
        ((10, 32, -1, 1), "context"),
        ((10, 32, 4, -2), "crossfade"),
        ((10, 9, 4, 1), "window=9 must exceed"),
        ((10, 32, 2.5, 1), "context"),
        ((10, 32, 4, 1, -1), "align"),
        ((10, 32, 4, 1, 1.5), "align"),
    ],
)
def test_plan_refuses_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        plan_windows(*args[:4], **({"align": args[4]} if len(args) > 4 else {}))


def test_engine_times_cudnn_algorithms_only_inside_its_calls():
    from stream_dit.decode import DecoderEngine

    _, adapter = tiny_decoder()
    seen = []
    hook = adapter.register_forward_pre_hook(
        lambda module, args: seen.append(torch.backends.cudnn.benchmark)
    )
    before = torch.backends.cudnn.benchmark
    z = torch.randn(1, adapter.latent_channels, 6)
    try:
        for flag in (True, False):
            DecoderEngine(adapter, max_batch=1, cudnn_benchmark=flag)(z)
    finally:
        hook.remove()
    assert seen == [True, before]
    assert torch.backends.cudnn.benchmark == before
