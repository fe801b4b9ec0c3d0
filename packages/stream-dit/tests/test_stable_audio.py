"""Stable Audio Open's diffusers transformer through the session: parity with driving diffusers.

Each request through a session at depth 1, 4 and 8, with and without CFG, must equal
:func:`reference_denoise`: ``StableAudioDiTModel.forward`` called the way ``StableAudioPipeline``
calls it (layout, rotary table, null condition, batched CFG) on that request alone, unpadded, on
the session's flow schedule with the flow ↔ v-prediction conversion of the module.
"""

from __future__ import annotations

import io
import math

import pytest
import torch

pytest.importorskip("diffusers")

from diffusers_test_helpers import (
    bucketed_results,
    check_bf16_session_parity,
    mixed_requests,
    session_results,
)
from serve_test_helpers import wait_for

from stream_dit import Request, StreamSession, TorchEngine
from stream_dit.model.stable_audio import (
    STABLE_AUDIO_PRESETS,
    StableAudioAdapter,
    build_stable_audio,
    flow_to_model,
    reference_denoise,
)
from stream_dit.model.stable_audio_attention import (
    NativeStableAudioAttnProcessor,
    diffusers_processors,
)

TOL = {"rtol": 1e-4, "atol": 1e-4}
C, D = 8, 32  # the tiny preset's latent channels and state width


@pytest.fixture(scope="module")
def sa():
    return build_stable_audio("tiny", seed=0)


def _requests(seed: int, n: int, *, cfg: bool) -> list[Request]:
    return mixed_requests(seed, n, cfg=cfg, cond_dim=D)


def _reference(adapter: StableAudioAdapter, r: Request) -> torch.Tensor:
    dev = next(adapter.parameters()).device
    noise = torch.randn(
        r.frames, adapter.latent_channels, generator=torch.Generator().manual_seed(r.seed)
    )
    cond = r.cond if r.cond_mask is None else r.cond[r.cond_mask]
    return reference_denoise(
        adapter.transformer,
        noise.to(dev),
        cond.to(dev),
        steps=r.steps,
        shift=r.shift,
        guidance=r.guidance if r.cfg_type == "full" else 1.0,
        negative=None if r.negative is None else r.negative.to(dev),
    ).cpu()


@pytest.mark.parametrize("cfg", [False, True], ids=["plain", "cfg"])
@pytest.mark.parametrize("depth", [1, 4, 8])
def test_session_matches_diffusers_per_request(sa, depth, cfg, seed):
    requests = _requests(seed, 10, cfg=cfg)
    assert len({r.frames for r in requests}) > 1
    got = session_results(sa, requests, depth)
    for r, x in zip(requests, got):
        assert torch.isfinite(x).all()
        torch.testing.assert_close(x, _reference(sa, r), **TOL)


def test_bucketed_padding_matches_too(sa, seed):
    """Compile-style buckets pad T, L and the batch further than the tick does."""
    requests = _requests(seed + 7, 5, cfg=True)
    for r, result in zip(requests, bucketed_results(sa, requests)):
        torch.testing.assert_close(result, _reference(sa, r), **TOL)


def test_padded_rows_equal_rows_alone(sa, seed):
    """A row of a padded batch (frames and states) equals the same row run unpadded."""
    gen = torch.Generator().manual_seed(seed)
    frames, length = (7, 13), (3, 6)
    x = torch.randn(2, 16, C, generator=gen)
    states = torch.randn(2, 8, D, generator=gen)
    t = torch.rand(2, generator=gen)
    frame_mask = torch.arange(16)[None] < torch.tensor(frames)[:, None]
    states_mask = torch.arange(8)[None] < torch.tensor(length)[:, None]
    got = sa(x, t, states, states_mask, frame_mask)
    for i in range(2):
        alone = sa(
            x[i : i + 1, : frames[i]],
            t[i : i + 1],
            states[i : i + 1, : length[i]],
            torch.ones(1, length[i], dtype=torch.bool),
        )
        torch.testing.assert_close(got[i : i + 1, : frames[i]], alone, **TOL)


def _cosine_scheduler():
    """diffusers' ``CosineDPMSolverMultistepScheduler`` (the pipeline's). Its module imports
    ``torchsde`` for the stochastic step only; the preconditioning used here does not need it, so
    without the package a placeholder module stands in during the import."""
    import importlib
    import sys
    import types

    name = "diffusers.schedulers.scheduling_cosine_dpmsolver_multistep"
    try:
        import torchsde  # noqa: F401

        module = importlib.import_module(name)
    except ImportError:
        names = ("torchsde", name, "diffusers.schedulers.scheduling_dpmsolver_sde")
        added = [n for n in names if n not in sys.modules]
        sys.modules["torchsde"] = types.ModuleType("torchsde")
        try:
            module = importlib.import_module(name)
        finally:
            for n in added:
                sys.modules.pop(n, None)
    return module.CosineDPMSolverMultistepScheduler(
        prediction_type="v_prediction", sigma_data=1.0, sigma_min=0.3, sigma_max=500.0
    )


def test_conversion_matches_diffusers_preconditioning(sa):
    """Away from t = 1 the adapter's map equals CosineDPMSolverMultistepScheduler's EDM
    preconditioning at σ = t / (1 − t): input c_in·x_edm, timestep atan(σ)·2/π, and the flow
    velocity (x − x0)/t with x0 = c_skip·x_edm + c_out·v."""
    sched = _cosine_scheduler()
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 9, C, generator=gen)
    states = torch.randn(3, 4, D, generator=gen)
    mask = torch.ones(3, 4, dtype=torch.bool)
    t = torch.tensor([0.2, 0.5, 0.9])
    got = sa(x, t, states, mask)
    scale, tau, _ = flow_to_model(t)
    for i, ti in enumerate(t.tolist()):
        sigma = torch.tensor(ti / (1 - ti))
        x_edm = x[i] / (1 - ti)
        x_in = sched.precondition_inputs(x_edm, sigma)
        torch.testing.assert_close(x_in, x[i] * scale[i], **TOL)
        torch.testing.assert_close(sched.precondition_noise(sigma), tau[i], **TOL)
        with diffusers_processors(sa.transformer):
            v = sa.transformer(
                x_in.T[None],
                tau[i : i + 1],
                encoder_hidden_states=states[i : i + 1],
                global_hidden_states=states[i].mean(0).repeat(2)[None, None],
                rotary_embedding=_rotary(sa, 9),
                return_dict=False,
            )[0][0].T
        x0 = sched.precondition_outputs(x_edm, v, sigma)
        torch.testing.assert_close(got[i], (x[i] - x0) / ti, **TOL)


def _rotary(adapter: StableAudioAdapter, frames: int):
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    return get_1d_rotary_pos_embed(
        adapter.rotary_dim, frames + 1, use_real=True, repeat_interleave_real=False
    )


def test_unconditional_row_is_the_pipeline_null_condition(sa):
    """No conditioning tokens: zero encoder states (of any length) and a zero global vector."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 11, C, generator=gen)
    t = torch.tensor([1.0, 0.4])
    states = torch.randn(2, 6, D, generator=gen)
    got = sa(x, t, states, torch.zeros(2, 6, dtype=torch.bool))
    # whatever the padded states hold, and whatever their length
    again = sa(x, t, torch.randn(2, 3, D, generator=gen), torch.zeros(2, 3, dtype=torch.bool))
    torch.testing.assert_close(got, again, **TOL)
    scale, tau, phi = flow_to_model(t)
    x_in = x * scale[:, None, None]
    with diffusers_processors(sa.transformer):
        v = sa.transformer(
            x_in.transpose(1, 2),
            tau,
            encoder_hidden_states=torch.zeros(2, 6, D),
            global_hidden_states=torch.zeros(2, 1, 2 * D),
            rotary_embedding=_rotary(sa, 11),
            return_dict=False,
        )[0].transpose(1, 2)
    sin, cos = phi.sin()[:, None, None], phi.cos()[:, None, None]
    want = (sin - cos) * x_in + (cos + sin) * v
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, **TOL)
    # at t = 1 the model sees the noise itself at τ = 1 and the velocity is x + v
    assert math.isclose(float(tau[0]), 1.0, abs_tol=1e-6)
    torch.testing.assert_close(got[0], x[0] + v[0], **TOL)


def test_adapter_traces_as_one_graph(sa):
    import torch._dynamo

    assert all(
        isinstance(m.processor, NativeStableAudioAttnProcessor)
        for m in sa.transformer.modules()
        if hasattr(m, "processor")
    )
    gen = torch.Generator().manual_seed(4)
    args = (
        torch.randn(2, 12, C, generator=gen),
        torch.rand(2, generator=gen),
        torch.randn(2, 5, D, generator=gen),
        torch.ones(2, 5, dtype=torch.bool),
        torch.ones(2, 12, dtype=torch.bool),
    )
    torch._dynamo.reset()
    explained = torch._dynamo.explain(sa)(*args)
    assert explained.graph_break_count == 0, [b.reason[:200] for b in explained.break_reasons]


def test_adapter_contract_and_errors(sa):
    from stream_dit.model import DenoiserAdapter

    assert isinstance(sa, DenoiserAdapter)
    assert (sa.latent_channels, sa.context_channels, sa.cond_dim) == (C, 0, D)
    gen = torch.Generator().manual_seed(1)
    out = sa(
        torch.randn(2, 5, C, generator=gen),
        torch.rand(2, generator=gen),
        torch.randn(2, 3, D, generator=gen),
        torch.ones(2, 3, dtype=torch.bool),
    )
    assert out.shape == (2, 5, C) and out.dtype == torch.float32 and out.is_contiguous()
    pub = STABLE_AUDIO_PRESETS["published"]
    assert (pub.in_channels, pub.num_layers, pub.attention_head_dim) == (64, 24, 64)
    assert (pub.num_attention_heads, pub.num_key_value_attention_heads) == (24, 12)
    assert (pub.cross_attention_dim, pub.cross_attention_input_dim) == (768, 768)
    assert (pub.time_proj_dim, pub.global_states_input_dim) == (256, 1536)
    with pytest.raises(ValueError, match="preset"):
        build_stable_audio("huge")
    with pytest.raises(TypeError, match="StableAudioPreset"):
        build_stable_audio(3)
    with pytest.raises(TypeError, match="StableAudioDiTModel"):
        StableAudioAdapter(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="global_states_input_dim"):
        build_stable_audio("tiny", global_states_input_dim=48)
    session = StreamSession(sa, TorchEngine(sa, max_batch=2, max_frames=32), depth=1)
    with pytest.raises(ValueError, match=r"cond must have shape \(L, 32\)"):
        session.submit(Request(frames=6, cond=torch.zeros(2, 64)))
    with pytest.raises(ValueError, match="context"):
        session.submit(Request(frames=6, cond=torch.zeros(2, D), context=torch.zeros(6, 4)))


def test_cli_serve_and_demo_with_stable_audio(monkeypatch, tmp_path, capsys):
    """``stream-dit serve --model stable-audio`` serves the diffusers model; the demo runs it."""
    pytest.importorskip("fastapi")
    uvicorn = pytest.importorskip("uvicorn")
    import numpy as np
    from fastapi.testclient import TestClient

    from stream_dit.cli import main
    from stream_dit.model import MODELS, build_denoiser, default_preset

    assert "stable-audio" in MODELS
    assert default_preset("stable-audio", "cpu") == "tiny"
    assert default_preset("stable-audio", "cuda") == "published"
    assert isinstance(build_denoiser("stable-audio"), StableAudioAdapter)
    apps = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: apps.append(app))
    argv = ["serve", "--model", "stable-audio", "--device", "cpu", "--max-frames", "32"]
    assert main([*argv, "--max-cond-len", "8", "--depth", "2"]) == 0
    with TestClient(apps[0]) as client:
        # the server warms its engine first (503 "warming" until then)
        assert wait_for(lambda: client.get("/health").status_code == 200, timeout=120)
        body = {"frames": 11, "cond_seed": 1, "cond_len": 3, "steps": 2, "cfg_type": "full"}
        resp = client.post("/generate", json={**body, "guidance": 2.0})
        assert resp.status_code == 200, resp.text
        latent = np.load(io.BytesIO(resp.content))
        assert latent.shape == (11, C) and np.isfinite(latent).all()
        assert client.post("/generate", json={**body, "frames": 40}).status_code == 400
    out_dir = str(tmp_path)
    assert (
        main(["demo", "--model", "stable-audio", "--output-dir", out_dir, "--requests", "2"]) == 0
    )
    assert "stable-audio: 2/2 requests" in capsys.readouterr().out


# ---------------------------------------------------------------- GPU: published size
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [False, True], ids=["plain", "cfg"])
def test_published_size_bf16_session_matches_diffusers_on_gpu(cfg):
    """Stable Audio Open 1.0's DiT in bf16: session at depth 1, 4, 8 vs the diffusers model driven
    per request in bf16. bf16 results depend on the batch (GEMM tiling), so the bound is relative
    to bf16's own error: at most 3x the distance of the bf16 reference from fp32."""

    def requests(cond_dim: int) -> list[Request]:
        gen = torch.Generator().manual_seed(11)
        return [
            Request(
                frames=100 - 7 * (i % 3),  # padded frames in every batch
                cond=torch.randn(12 + 5 * (i % 2), cond_dim, generator=gen),
                seed=i,
                steps=4,
                shift=3.0,
                **({"cfg_type": "full", "guidance": 3.0} if cfg else {}),
            )
            for i in range(8)
        ]

    check_bf16_session_parity(
        lambda dtype: build_stable_audio("published", seed=0, device="cuda", dtype=dtype),
        _reference,
        requests,
    )
