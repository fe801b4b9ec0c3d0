"""TensorRT engine: ONNX export checked in onnxruntime; the wrapper checked against a fake runtime."""

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from stream_dit import Request, StreamSession, TorchEngine
from stream_dit.engines.tensorrt import (
    OptimizationProfile,
    TensorRTEngine,
    export_onnx,
)

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def test_onnx_export_matches_pytorch_at_several_shapes(tiny_model, tmp_path, rng):
    path = export_onnx(
        tiny_model,
        tmp_path / "dit.onnx",
        OptimizationProfile(batch=(1, 2, 4), frames=(1, 12, 32), cond_len=(1, 5, 9)),
    )
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for b, t, n in ((2, 12, 5), (3, 7, 2), (1, 20, 9)):
        x = torch.randn(b, t, 64, generator=rng)
        ts = torch.rand(b, generator=rng)
        s = torch.randn(b, n, 32, generator=rng)
        m = torch.ones(b, n, dtype=torch.bool)
        m[0, n // 2 :] = False
        fm = torch.ones(b, t, dtype=torch.bool)
        fm[-1, t // 2 :] = False
        ref = tiny_model(x, ts, s, m, fm)
        (got,) = sess.run(
            None,
            {
                "x": x.numpy(),
                "t": ts.numpy(),
                "states": s.numpy(),
                "states_mask": m.numpy(),
                "frame_mask": fm.numpy(),
            },
        )
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-4)


def _view(ptr: int, shape, dtype) -> torch.Tensor:
    n = int(np.prod(shape))
    ctype = {torch.float32: ctypes.c_float, torch.bool: ctypes.c_bool}[dtype]
    buf = (ctype * n).from_address(ptr)
    return (
        torch.frombuffer(buf, dtype=dtype, count=n).view(*shape)
        if n
        else torch.empty(shape, dtype=dtype)
    )


class FakeContext:
    """Computes velocity = model(inputs) from the bound addresses, like an engine would."""

    def __init__(self, model, log):
        self.model, self.log, self.shapes, self.addresses = model, log, {}, {}

    def set_input_shape(self, name, shape):
        self.shapes[name] = shape
        return True

    def set_tensor_address(self, name, ptr):
        self.addresses[name] = ptr
        return True

    def execute_async_v3(self, stream):
        self.log.append(("execute", stream))
        dtypes = {
            "x": torch.float32,
            "t": torch.float32,
            "states": torch.float32,
            "states_mask": torch.bool,
            "frame_mask": torch.bool,
            "context": torch.float32,
        }
        ins = {n: _view(self.addresses[n], s, dtypes[n]).clone() for n, s in self.shapes.items()}
        out = _view(self.addresses["velocity"], self.shapes["x"], torch.float32)
        out.copy_(self.model(**ins))
        return True


def _fake_trt(model, log):
    ctx = FakeContext(model, log)
    engine = SimpleNamespace(create_execution_context=lambda: ctx)
    trt = SimpleNamespace(
        Logger=type("Logger", (), {"WARNING": 0, "__init__": lambda self, level: None}),
        Runtime=lambda logger: SimpleNamespace(
            deserialize_cuda_engine=lambda data: engine if data == b"plan" else None
        ),
    )
    return trt, ctx


class FakeOrdering:
    handle = 1234

    def __init__(self, log):
        self.log = log

    def before(self, tensors):
        self.log.append(("current stream -> engine stream", len(tensors)))

    def after(self):
        self.log.append(("engine stream -> current stream",))


def _engine(model, log, profile=None):
    trt, ctx = _fake_trt(model, log)
    profile = profile or OptimizationProfile(
        batch=(1, 4, 4), frames=(1, 16, 32), cond_len=(1, 8, 9)
    )
    ctx_channels = getattr(model, "context_channels", 0)
    engine = TensorRTEngine(
        b"plan",
        profile,
        64,
        model.cond_dim,
        device="cpu",
        trt=trt,
        ordering=FakeOrdering(log),
        context_channels=ctx_channels,
    )
    return engine, ctx


def test_wrapper_binds_orders_and_reuses_buffers_by_shape(tiny_model, rng):
    log = []
    eng, ctx = _engine(tiny_model, log)
    x = torch.randn(2, 10, 64, generator=rng)
    t = torch.rand(2, generator=rng)
    s = torch.randn(2, 3, 32, generator=rng)
    m = torch.ones(2, 3, dtype=torch.bool)
    out1 = eng.forward(x, t, s, m)
    torch.testing.assert_close(out1, tiny_model(x, t, s, m), rtol=1e-5, atol=1e-5)
    assert [e[0] for e in log] == [
        "current stream -> engine stream",
        "execute",
        "engine stream -> current stream",
    ]
    assert log[1][1] == 1234 and ctx.addresses["velocity"] == out1.data_ptr()
    first = out1.clone()
    out2 = eng.forward(x * 2, t, s, m)
    assert out2.data_ptr() == out1.data_ptr()  # same shape: same buffer, overwritten
    assert not torch.allclose(out1, first)
    out3 = eng.forward(x[:1], t[:1], s[:1], m[:1])
    assert out3.data_ptr() != out1.data_ptr()


def test_wrapper_rejects_shapes_outside_the_profile(tiny_model):
    eng, _ = _engine(tiny_model, [])
    with pytest.raises(ValueError, match="batch"):
        eng.forward(
            torch.zeros(5, 4, 64),
            torch.zeros(5),
            torch.zeros(5, 2, 32),
            torch.ones(5, 2, dtype=torch.bool),
        )
    with pytest.raises(ValueError, match="T="):
        eng.forward(
            torch.zeros(1, 40, 64),
            torch.zeros(1),
            torch.zeros(1, 2, 32),
            torch.ones(1, 2, dtype=torch.bool),
        )
    with pytest.raises(ValueError, match="min <= opt <= max"):
        OptimizationProfile(batch=(4, 2, 8))
    with pytest.raises(RuntimeError, match="deserialize"):
        TensorRTEngine(
            b"junk",
            OptimizationProfile(),
            64,
            32,
            device="cpu",
            trt=_fake_trt(tiny_model, [])[0],
            ordering=FakeOrdering([]),
        )


def test_session_over_the_fake_engine_matches_torch_with_two_pass_cfg(tiny_model, rng):
    eng, _ = _engine(
        tiny_model, [], OptimizationProfile(batch=(1, 2, 2), frames=(1, 16, 32), cond_len=(1, 8, 9))
    )
    reqs = [
        Request(
            frames=10 + i,
            cond=torch.randn(3, 32, generator=rng),
            negative=torch.randn(2, 32, generator=rng),
            seed=i,
            steps=3,
            cfg_type="full",
            guidance=3.0,
        )
        for i in range(2)
    ]
    a = StreamSession(tiny_model, eng, depth=2)
    ha = [a.submit(Request(**r.__dict__)) for r in reqs]
    a.tick()
    assert a.last_stats.passes == 2
    a.run_until_idle()
    b = StreamSession(tiny_model, TorchEngine(tiny_model, max_batch=4), depth=2)
    hb = [b.submit(Request(**r.__dict__)) for r in reqs]
    b.run_until_idle()
    for x, y in zip(ha, hb):
        torch.testing.assert_close(x.result, y.result, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- ACE-Step (diffusers)
@pytest.fixture(scope="module")
def ace():
    pytest.importorskip("diffusers")
    from stream_dit.model.ace_step import build_ace_step

    return build_ace_step("tiny", seed=0)


def test_ace_step_onnx_export_matches_pytorch_at_several_shapes(ace, tmp_path, rng):
    """The diffusers model (GQA, sliding-window band, patch 2, context input) exported with
    dynamic batch, T (odd and even) and L, unconditional rows included, run in onnxruntime."""
    path = export_onnx(
        ace,
        tmp_path / "ace.onnx",
        OptimizationProfile(batch=(1, 2, 4), frames=(1, 12, 32), cond_len=(1, 5, 9)),
    )
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()][-1] == "context"
    for b, t, n in ((2, 12, 5), (3, 7, 2), (1, 21, 9), (4, 13, 3)):
        x = torch.randn(b, t, 64, generator=rng)
        ts = torch.rand(b, generator=rng)
        s = torch.randn(b, n, 32, generator=rng)
        m = torch.ones(b, n, dtype=torch.bool)
        m[0, n // 2 :] = False
        if b > 1:
            m[1] = False  # the null condition
        fm = torch.ones(b, t, dtype=torch.bool)
        fm[-1, t // 2 :] = False
        c = torch.randn(b, t, 128, generator=rng)
        ref = ace(x, ts, s, m, fm, c)
        feed = {"x": x, "t": ts, "states": s, "states_mask": m, "frame_mask": fm, "context": c}
        (got,) = sess.run(None, {k: v.numpy() for k, v in feed.items()})
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-4)


def test_ace_step_export_rotary_equals_diffusers(rng):
    pytest.importorskip("diffusers")
    from diffusers.models.embeddings import apply_rotary_emb, get_1d_rotary_pos_embed

    from stream_dit.model.ace_step import _rotary_for_export

    x = torch.randn(2, 9, 4, 16, generator=rng)
    freqs = get_1d_rotary_pos_embed(16, torch.arange(9.0), theta=1e6, use_real=True)
    want = apply_rotary_emb(x, freqs, use_real=True, use_real_unbind_dim=-2, sequence_dim=1)
    got = _rotary_for_export(x, freqs, use_real=True, use_real_unbind_dim=-2, sequence_dim=1)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_ace_step_session_over_the_fake_engine_binds_context(ace, rng):
    eng, ctx = _engine(
        ace, [], OptimizationProfile(batch=(1, 2, 4), frames=(1, 16, 32), cond_len=(1, 8, 9))
    )
    reqs = [
        Request(
            frames=9 + i,
            cond=torch.randn(3 + i, 32, generator=rng),
            context=torch.randn(9 + i, 128, generator=rng) if i else None,
            seed=i,
            steps=3,
            cfg_type="full",
            guidance=3.0,
        )
        for i in range(2)
    ]
    a = StreamSession(ace, eng, depth=2)
    ha = [a.submit(Request(**r.__dict__)) for r in reqs]
    a.run_until_idle()
    assert ctx.shapes["context"][2] == 128
    b = StreamSession(ace, TorchEngine(ace, max_batch=4), depth=2)
    hb = [b.submit(Request(**r.__dict__)) for r in reqs]
    b.run_until_idle()
    for x, y in zip(ha, hb):
        torch.testing.assert_close(x.result, y.result, rtol=1e-4, atol=1e-4)
