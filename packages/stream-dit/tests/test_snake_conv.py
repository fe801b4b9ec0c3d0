"""The Snake-convolution layer against its float64 spec, and the fused Oobleck decoder against
diffusers' own modules (an independent reference: ``nn.Conv1d``/``nn.ConvTranspose1d``)."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

import stream_dit.ops.snake_conv.plan as plan
from stream_dit.ops.snake_conv import (
    Head,
    Pointwise,
    Snake,
    prepare_snake_conv,
    snake_conv,
    snake_conv_reference,
)
from triton_dispatch.launch import clear_plan_caches
from triton_dispatch.testing import assert_close, poison_

pytest.importorskip("diffusers")

from decode_test_helpers import THREE_BLOCKS, tiny_decoder

from stream_dit.decode import DecoderEngine
from stream_dit.decode.fused import FusedOobleck

#: (taps, dilation, C_in, C_out, phases, shift, pointwise, residual, out_snake, store_out, L_in)
LAYERS = {
    "dilated-residual-snake": (7, 3, 24, 20, 1, 0, False, True, True, True, 21),
    "transposed-odd-stride": (2, 1, 16, 12, 3, 2, False, False, True, True, 9),
    "unit-pointwise": (7, 1, 16, 16, 1, 0, True, True, True, False, 19),
    "wide-in-narrow-out": (1, 1, 80, 2, 1, 0, False, False, False, True, 13),
}


def _snake(gen, c):
    return Snake(torch.randn(c, generator=gen).mul(0.3).exp(), torch.rand(c, generator=gen) + 0.5)


def _layer(gen, case, dtype, device, head=None):
    """``head``: ``(taps, C_head, dilation)`` of a last convolution on the Snake output."""
    taps, dil, cin, cout, phases, shift, pw, res, act, store, length = case
    w = torch.randn(taps, cin, phases * cout, generator=gen) / (taps * cin) ** 0.5
    b = torch.randn(phases * cout, generator=gen)
    pointwise = None
    if pw:
        pointwise = Pointwise(_snake(gen, cout), torch.randn(cout, cout, generator=gen) / cout**0.5,
                              torch.randn(cout, generator=gen))  # fmt: skip
    out_snake = _snake(gen, cout) if act else None
    padding = 1 if phases > 1 else None
    if head is not None:
        h_taps, h_out, h_dil = head
        h_w = torch.randn(h_taps, cout, h_out, generator=gen) / (h_taps * cout) ** 0.5
        head = (h_w, torch.randn(h_out, generator=gen), h_dil, h_dil * (h_taps - 1) // 2)

    def build(dt, dev):
        cast = lambda t: t.to(dev, dt)
        pwise = None if pointwise is None else Pointwise(
            Snake(*(cast(t) for t in pointwise.snake)), cast(pointwise.weight), cast(pointwise.bias)
        )  # fmt: skip
        osn = None if out_snake is None else Snake(*(cast(t) for t in out_snake))
        hd = None if head is None else Head(cast(head[0]), cast(head[1]), *head[2:])
        return prepare_snake_conv(
            cast(w), cast(b), dilation=dil, padding=padding, phases=phases, shift=shift,
            pointwise=pwise, out_snake=osn, store_out=store, head=hd,
        )  # fmt: skip

    x = torch.randn(2, length, cin, generator=gen)
    layer = build(dtype, device)
    out_length = layer.output_length(length)
    r = torch.randn(2, out_length, cout, generator=gen) if res else None
    return layer, build(torch.float64, "cpu"), x, r


CASES = [(name, torch.float32) for name in sorted(LAYERS)] + [("unit-pointwise", torch.float16)]


def poisoned_outputs(monkeypatch):
    def output(shape, like):
        return poison_(torch.empty(shape, dtype=like.dtype, device=like.device))

    monkeypatch.setattr(plan, "output", output)


@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_layer_matches_float64_spec_into_poisoned_buffers(rng, device, monkeypatch, name, dtype):
    layer, ref_layer, x, r = _layer(rng, LAYERS[name], dtype, device)
    poisoned_outputs(monkeypatch)
    out, act = snake_conv(
        x.to(device, dtype), layer, residual=None if r is None else r.to(device, dtype)
    )
    want_out, want_act = snake_conv(
        x.double(), ref_layer, residual=None if r is None else r.double()
    )
    assert (out is None) == (want_out is None) and (act is None) == (want_act is None)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    for got, want, what in ((out, want_out, "out"), (act, want_act, "snake_out")):
        if want is not None:
            assert got.shape == want.shape and got.dtype == dtype
            assert_close(got, want, tol=tol, name=what)


@pytest.mark.parametrize("name", ["transposed-odd-stride", "unit-pointwise", "wide-in-narrow-out"])
def test_persistent_programs_cover_every_tile(rng, device, monkeypatch, name):
    """The launch whose programs walk the tiles (the transposed and 1x1 layers' on Hopper), here
    one program walking every tile of both batch rows: each tile written once."""
    shipped = plan.launch_config
    monkeypatch.setattr(
        plan, "launch_config", lambda *a: shipped(*a)._replace(block_m=16, persistent=1)
    )
    one_sm = SimpleNamespace(sm_count=1, shared_memory_per_block=232_448)
    monkeypatch.setattr(plan, "device_facts", lambda device: one_sm)
    clear_plan_caches()  # plans bind their tiles
    try:
        test_layer_matches_float64_spec_into_poisoned_buffers(
            rng, device, monkeypatch, name, torch.float32
        )
    finally:
        clear_plan_caches()


@pytest.mark.parametrize(
    ("name", "head", "dtype"),
    [
        ("unit-pointwise", (7, 2, 1), torch.float32),
        ("unit-pointwise", (4, 3, 2), torch.float32),
        ("dilated-residual-snake", (3, 1, 1), torch.float32),
        ("unit-pointwise", (7, 2, 1), torch.float16),
    ],
)
def test_head_matches_float64_spec_into_poisoned_buffers(
    rng, device, monkeypatch, name, head, dtype
):
    """A last convolution folded into the epilogue equals that convolution of the Snake output
    (neighbours' partial sums across tile edges, zero padding at both ends)."""
    layer, ref_layer, x, r = _layer(rng, LAYERS[name], dtype, device, head=head)
    poisoned_outputs(monkeypatch)
    out, audio = snake_conv(
        x.to(device, dtype), layer, residual=None if r is None else r.to(device, dtype)
    )
    want_out, want_audio = snake_conv(
        x.double(), ref_layer, residual=None if r is None else r.double()
    )
    _, act = snake_conv(x.double(), dataclasses.replace(ref_layer, head=None),
                        residual=None if r is None else r.double())  # fmt: skip
    conv = torch.nn.functional.conv1d(  # the head as torch's own convolution
        act.transpose(1, 2), ref_layer.head.weight.permute(2, 1, 0), ref_layer.head.bias,
        dilation=head[2], padding=ref_layer.head.padding,
    ).transpose(1, 2)  # fmt: skip
    torch.testing.assert_close(want_audio, conv, rtol=1e-12, atol=1e-12)
    assert (out is None) == (want_out is None)
    assert audio.shape == (2, x.shape[1], head[1]) and audio.dtype == dtype
    tol = {torch.float32: 1e-5, torch.float16: 2e-3}[dtype]
    assert_close(audio, want_audio, tol=tol, name="head_out")
    if out is not None:
        assert_close(out, want_out, tol=tol, name="out")


def test_reference_backend_is_the_spec(rng):
    layer, _, x, r = _layer(rng, LAYERS["dilated-residual-snake"], torch.float32, "cpu")
    got = snake_conv(x, layer, residual=r, backend="torch")
    want = snake_conv_reference(
        x, layer.weight, layer.bias, dilation=3, padding=9, phases=1, shift=0, out_length=21,
        pointwise=None, residual=r, out_snake=layer.out_snake, store_out=True,
    )  # fmt: skip
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_bad_inputs(rng):
    layer, _, x, r = _layer(rng, LAYERS["dilated-residual-snake"], torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"x must be \(B, L, 24\)"):
        snake_conv(x[..., :20].contiguous(), layer)
    with pytest.raises(TypeError, match="x must match the layer's weights"):
        snake_conv(x.half(), layer)
    with pytest.raises(ValueError, match="x must be contiguous"):
        snake_conv(x.transpose(0, 1).contiguous().transpose(0, 1), layer)
    with pytest.raises(ValueError, match=r"residual must be a tensor of shape \(2, 21, 20\)"):
        snake_conv(x, layer, residual=r[:, :5].contiguous())
    with pytest.raises(ValueError, match="residual must be contiguous"):
        snake_conv(x, layer, residual=r[:, :5])
    with pytest.raises(TypeError, match="layer must come from prepare_snake_conv"):
        snake_conv(x, object())
    w = torch.randn(7, 24, 20)
    with pytest.raises(ValueError, match="weight must be a tensor of shape"):
        prepare_snake_conv(w[0])
    with pytest.raises(ValueError, match="pointwise needs phases == 1"):
        prepare_snake_conv(
            torch.randn(2, 4, 8), phases=2, pointwise=Pointwise(_snake(rng, 4), torch.eye(4), None)
        )
    with pytest.raises(ValueError, match="dilation must be an int >= 1"):
        prepare_snake_conv(w, dilation=0)
    with pytest.raises(ValueError, match="must store its output"):
        prepare_snake_conv(w, store_out=False)
    act = _snake(rng, 20)
    with pytest.raises(ValueError, match="head needs phases == 1"):
        prepare_snake_conv(w, head=Head(torch.randn(7, 20, 2), None, 1, 3))  # no out_snake
    with pytest.raises(ValueError, match=r"head.weight must be \(taps, 20, C_head\)"):
        prepare_snake_conv(w, out_snake=act, head=Head(torch.randn(7, 19, 2), None, 1, 3))
    with pytest.raises(ValueError, match="head must keep the length"):
        prepare_snake_conv(w, out_snake=act, head=Head(torch.randn(7, 20, 2), None, 1, 2))
    with pytest.raises(TypeError, match=r"head\.weight must be torch\.float32"):
        prepare_snake_conv(w, out_snake=act, head=Head(torch.randn(7, 20, 2).double(), None, 1, 3))
    empty = snake_conv(x[:0], layer, residual=r[:0])
    assert empty[0].shape == (0, 21, 20) and empty[1].shape == (0, 21, 20)


@pytest.mark.parametrize("chunk_frames", [None, 2])
@pytest.mark.parametrize("preset", ["tiny", "three-blocks"])
def test_fused_decoder_matches_the_adapter(rng, device, preset, chunk_frames):
    """Every layer kind (first convolution, transposed ones of each stride, residual units fused
    and not, the last convolution) against diffusers' modules in float64; in one pass and with
    the levels after the first block in chunks of 2 frames (4 chunks, each with its context)."""
    _, adapter = tiny_decoder(THREE_BLOCKS if preset == "three-blocks" else "tiny")
    z = torch.randn(2, adapter.latent_channels, 7, generator=rng)
    want = adapter.double()(z.double())
    fused = FusedOobleck(adapter.float().to(device), chunk_frames=chunk_frames)
    assert len(fused.chunks(7)) == (1 if chunk_frames is None else 4)
    got = fused(z.to(device))
    assert got.shape == want.shape
    assert_close(got, want, tol=2e-6, name="audio")


@pytest.mark.parametrize("chunk_frames", [None, 2])
def test_compile_ahead_plans_every_launch_of_the_call(rng, device, monkeypatch, chunk_frames):
    """The launches ``compile_ahead`` plans (and starts compiling) are those ``forward`` makes:
    the same layers on the same shapes, so the call finds every plan built; under the
    interpreter each plan's ``compile_ahead`` still checks its launches' argument counts."""
    import stream_dit.decode.fused as fused_module
    from stream_dit.ops.snake_conv.op import SNAKE_CONV

    _, adapter = tiny_decoder(THREE_BLOCKS)
    z = torch.randn(2, adapter.latent_channels, 7, generator=rng)
    want = adapter.double()(z.double())
    fused = FusedOobleck(adapter.float().to(device), chunk_frames=chunk_frames)
    seen = set()

    def recording(x, layer, *, residual=None, backend=None):
        seen.add((id(layer), tuple(x.shape), None if residual is None else tuple(residual.shape)))
        return snake_conv(x, layer, residual=residual, backend=backend)

    monkeypatch.setattr(fused_module, "snake_conv", recording)
    clear_plan_caches()
    fused.compile_ahead(2, 7)
    fused.compile_ahead(2, 7)  # once per shape
    planned = SNAKE_CONV._kernel_plans.misses
    got = fused(z.to(device))
    assert SNAKE_CONV._kernel_plans.misses == planned  # every plan was there already
    ahead = {(id(layer), s, r) for layer, s, r in fused._launches(2, 7)}
    assert ahead == seen
    assert_close(got, want, tol=2e-6, name="audio")


def test_chunks_carry_their_receptive_field(rng):
    """Chunked equals one pass exactly, and one sample less of context than the receptive field
    gives does not: the context is what makes chunks exact, and no more than that."""
    _, adapter = tiny_decoder(THREE_BLOCKS)
    adapter = adapter.double()
    z = torch.randn(1, adapter.latent_channels, 9, generator=rng, dtype=torch.float64)
    whole = FusedOobleck(adapter, chunk_frames=None, backend="torch")(z)
    chunked = FusedOobleck(adapter, chunk_frames=2, backend="torch")
    torch.testing.assert_close(chunked(z), whole, rtol=0, atol=1e-12)
    chunked._halo -= 1
    assert float((chunked(z) - whole).abs().max()) > 1e-9
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="chunk_frames must be None or an int >= 1"):
            FusedOobleck(adapter, chunk_frames=bad)


def test_fused_engine_modes(rng):
    _, adapter = tiny_decoder()
    engine = DecoderEngine(adapter, max_batch=2, mode="fused")
    assert isinstance(engine.adapter, FusedOobleck) and engine.reuses_output is False
    z = torch.randn(1, adapter.latent_channels, 6, generator=rng)
    torch.testing.assert_close(engine(z), adapter(z), atol=1e-5, rtol=1e-4)
    assert engine.graph_memory_bytes() == 0  # no graphs, nothing held between calls
    with pytest.raises(ValueError, match="needs the decoder on a CUDA device"):
        DecoderEngine(adapter, mode="fused-graphs")
    with pytest.raises(TypeError, match="needs an OobleckAdapter"):
        DecoderEngine(torch.nn.Linear(2, 2), mode="fused")


def test_traced_call_is_the_op(rng, device):
    """Under ``torch.compile`` a layer is the custom op ``stream_dit::snake_conv`` (its fake gives
    the shapes, no graph break) and gives what the eager call gives."""
    layer, _, x, r = _layer(rng, LAYERS["unit-pointwise"], torch.float32, device)
    x, r = x.to(device), r.to(device)
    eager = snake_conv(x, layer, residual=r)
    traced = torch.compile(lambda a, b: snake_conv(a, layer, residual=b), backend="eager",
                           fullgraph=True)(x, r)  # fmt: skip
    assert traced[0] is None and eager[0] is None
    torch.testing.assert_close(traced[1], eager[1], rtol=0, atol=0)
