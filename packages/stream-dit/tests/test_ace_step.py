"""ACE-Step 1.5's diffusers transformer through the session: parity with driving diffusers directly.

Each request through a session at depth 1, 4 and 8, with and without CFG, must equal
:func:`reference_denoise`, the ACE-Step pipeline's loop (its schedule, its Euler scheduler, its
``timestep_r = t`` and null-condition conventions) calling ``AceStepTransformer1DModel.forward``
on that request alone, unpadded.
"""

from __future__ import annotations

import io

import pytest
import torch

pytest.importorskip("diffusers")

from diffusers_test_helpers import (
    bucketed_results,
    check_bf16_session_parity,
    mixed_requests,
    relative_distance,
    session_results,
)
from serve_test_helpers import wait_for

from stream_dit import Request, StreamSession, TorchEngine
from stream_dit.model.ace_step import (
    ACE_STEP_PRESETS,
    AceStepAdapter,
    build_ace_step,
    reference_denoise,
)
from stream_dit.model.ace_step_attention import NativeAceStepAttnProcessor, diffusers_processors

TOL = {"rtol": 1e-4, "atol": 1e-4}


@pytest.fixture(scope="module")
def ace():
    return build_ace_step("tiny", seed=0)


def _requests(seed: int, n: int, *, cfg: bool) -> list[Request]:
    return mixed_requests(seed, n, cfg=cfg, cond_dim=32, context_channels=128)


def _reference(adapter: AceStepAdapter, r: Request) -> torch.Tensor:
    dev = adapter.null_condition.device
    noise = torch.randn(r.frames, 64, generator=torch.Generator().manual_seed(r.seed))
    cond = r.cond if r.cond_mask is None else r.cond[r.cond_mask]
    return reference_denoise(
        adapter.transformer,
        noise.to(dev),
        cond.to(dev),
        steps=r.steps,
        shift=r.shift,
        null_condition=adapter.null_condition,
        guidance=r.guidance if r.cfg_type == "full" else 1.0,
        negative=None if r.negative is None else r.negative.to(dev),
        context=None if r.context is None else r.context.to(dev),
    ).cpu()


@pytest.mark.parametrize("cfg", [False, True], ids=["plain", "cfg"])
@pytest.mark.parametrize("depth", [1, 4, 8])
def test_session_matches_diffusers_per_request(ace, depth, cfg, seed):
    requests = _requests(seed, 10, cfg=cfg)
    got = session_results(ace, requests, depth)
    for r, x in zip(requests, got):
        torch.testing.assert_close(x, _reference(ace, r), **TOL)


def test_bucketed_padding_matches_too(ace, seed):
    """Compile-style buckets pad T, L and the batch further than the tick does."""
    requests = _requests(seed + 7, 5, cfg=True)
    for r, result in zip(requests, bucketed_results(ace, requests)):
        torch.testing.assert_close(result, _reference(ace, r), **TOL)


def test_unconditional_row_is_the_broadcast_null_condition(ace):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 11, 64, generator=gen)
    ctx = torch.randn(2, 11, 128, generator=gen)
    t = torch.tensor([0.9, 0.4])
    got = ace(
        x, t, torch.randn(2, 6, 32, generator=gen), torch.zeros(2, 6, dtype=torch.bool), None, ctx
    )
    null = ace.null_condition.reshape(1, 1, -1).expand(2, 6, -1)
    with diffusers_processors(ace.transformer):
        want = ace.transformer(
            hidden_states=x,
            timestep=t,
            timestep_r=t,
            encoder_hidden_states=null,
            context_latents=ctx,
            return_dict=False,
        )[0]
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, **TOL)


def test_adapter_traces_as_one_graph(ace):
    """diffusers' processor looks its backend up per call (an enum dynamo cannot trace): the
    adapter's native processor keeps the whole forward in one compiled graph."""
    import torch._dynamo

    assert all(
        isinstance(m.processor, NativeAceStepAttnProcessor)
        for m in ace.transformer.modules()
        if hasattr(m, "processor")
    )
    gen = torch.Generator().manual_seed(4)
    args = (
        torch.randn(2, 12, 64, generator=gen),
        torch.rand(2, generator=gen),
        torch.randn(2, 5, 32, generator=gen),
        torch.ones(2, 5, dtype=torch.bool),
        torch.ones(2, 12, dtype=torch.bool),
    )
    torch._dynamo.reset()
    explained = torch._dynamo.explain(ace)(*args)
    assert explained.graph_break_count == 0, [b.reason[:200] for b in explained.break_reasons]


def test_adapter_contract_and_errors(ace):
    assert (ace.latent_channels, ace.context_channels, ace.cond_dim) == (64, 128, 32)
    pub = ACE_STEP_PRESETS["published"]
    assert (pub.hidden_size, pub.num_hidden_layers, pub.num_attention_heads) == (2048, 24, 16)
    assert (pub.num_key_value_heads, pub.head_dim, pub.in_channels) == (8, 128, 192)
    assert (pub.patch_size, pub.sliding_window) == (2, 128)
    with pytest.raises(ValueError, match="preset"):
        build_ace_step("huge")
    with pytest.raises(TypeError, match="AceStepTransformer1DModel"):
        AceStepAdapter(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="null_condition"):
        AceStepAdapter(ace.transformer, torch.zeros(5))
    session = StreamSession(ace, TorchEngine(ace, max_batch=2, max_frames=32), depth=1)
    with pytest.raises(ValueError, match=r"context must have shape \(6, 128\)"):
        session.submit(Request(frames=6, cond=torch.zeros(2, 32), context=torch.zeros(6, 64)))
    with pytest.raises(ValueError, match=r"cond must have shape \(L, 32\)"):
        session.submit(Request(frames=6, cond=torch.zeros(2, 64)))


def _fused_inputs(seed: int, rows: int = 4, frames: int = 23, length: int = 6):
    """A padded batch: short rows, conditioning of several lengths, an unconditional row, a row
    without context, odd T (the patchify pad)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, frames, 64, generator=gen)
    t = torch.rand(rows, generator=gen)
    states = torch.randn(rows, length, 32, generator=gen)
    states_mask = torch.arange(length)[None] < torch.tensor([length, 3, 0, 1][:rows])[:, None]
    frame_mask = torch.arange(frames)[None] < torch.tensor([frames, 9, frames, 14][:rows])[:, None]
    context = torch.randn(rows, frames, 128, generator=gen)
    return x, t, states, states_mask, frame_mask, context


@pytest.mark.parametrize(
    ("with_masks", "fold", "out_bias"),
    [(True, False, False), (False, False, False), (True, True, False), (True, True, True)],
    ids=["padded", "full", "padded-folded", "padded-folded-bias"],
)
def test_fused_blocks_match_diffusers_blocks(seed, with_masks, fold, out_bias, monkeypatch):
    """The fused path (stacked projections, fused norms, rotary, SwiGLU and the banded attention
    kernel, run here in Triton's interpreter) against diffusers' blocks on the same inputs; on
    the real rows of a padded batch too. ``fold``: the cross-attention as weights times values
    through the output projection, which the published size takes from 256 latent tokens (the
    residual added in place, or, with ``out_bias``, the bias added in the product)."""
    from stream_dit.model import ace_step_fused

    calls = []
    monkeypatch.setattr(
        ace_step_fused, "folds_cross_values", lambda *sizes: calls.append(sizes) or fold
    )
    monkeypatch.setenv(ace_step_fused.FOLD_ENV_VAR, "1" if fold else "0")
    fused = build_ace_step("tiny", seed=seed % 1000, fused=True)
    if out_bias:
        _give_cross_out_bias(fused, seed)
    x, t, states, states_mask, frame_mask, context = _fused_inputs(seed)
    if not with_masks:
        frame_mask, context = None, None
    with torch.no_grad():
        got = fused(x, t, states, states_mask, frame_mask, context)
        fused.fused = False
        want = fused(x, t, states, states_mask, frame_mask, context)
    torch.testing.assert_close(_real(got, frame_mask), _real(want, frame_mask), **TOL)
    assert torch.isfinite(got).all()  # padded frames stay finite (they feed nothing, NaN would)
    assert bool(calls) == fold  # the route is asked only when the fold is switched on


@pytest.mark.parametrize(
    ("fold", "out_bias", "conditioned"),
    [(True, False, 2), (True, True, 2), (False, False, 2), (True, False, 0), (False, False, 4)],
    ids=["folded", "folded-bias", "direct", "all-null", "none-null"],
)
def test_rows_without_tokens_skip_their_cross_attention(seed, fold, out_bias, conditioned,
                                                         monkeypatch):  # fmt: skip
    """``conditioned_rows``: the rows after it have no conditioning tokens (CFG's null rows):
    their cross-attention is the null token's value through the output projection, computed
    once per row, and the batch's output is the one of the path that attends per query, and
    diffusers' blocks'. The leading rows keep padded frames and masked tokens."""
    from stream_dit.model import ace_step_fused

    monkeypatch.setattr(ace_step_fused, "folds_cross_values", lambda *sizes: fold)
    fused = build_ace_step("tiny", seed=seed % 1000, fused=True)
    if out_bias:
        _give_cross_out_bias(fused, seed)
    x, t, states, states_mask, frame_mask, context = _fused_inputs(seed)
    states_mask[conditioned:] = False
    calls = []
    real_blocks = ace_step_fused.FusedAceStep.blocks
    monkeypatch.setattr(ace_step_fused.FusedAceStep, "blocks",
                        lambda self, *a: calls.append(a[-1]) or real_blocks(self, *a))  # fmt: skip
    with torch.no_grad():
        got = fused(x, t, states, states_mask, frame_mask, context, conditioned_rows=conditioned)
        every = fused(x, t, states, states_mask, frame_mask, context)
        fused.fused = False
        want = fused(x, t, states, states_mask, frame_mask, context)
    assert calls == [conditioned, None]
    torch.testing.assert_close(_real(got, frame_mask), _real(every, frame_mask), **TOL)
    torch.testing.assert_close(_real(got, frame_mask), _real(want, frame_mask), **TOL)
    assert torch.isfinite(got).all()
    with pytest.raises(ValueError, match=r"conditioned_rows must be an int in \[0, 4\]"):
        fused(x, t, states, states_mask, frame_mask, context, conditioned_rows=5)


def test_guided_session_skips_the_null_rows_cross_attention(seed, monkeypatch):
    """A session of guided requests on the fused path: its ticks pass the engine the number of
    leading rows with tokens (negatives without a prompt come last and have none), and each
    request's result is what the pipeline's loop gives it alone."""
    from stream_dit.model import ace_step_fused

    fused = build_ace_step("tiny", seed=0, fused=True)
    seen = []
    real_blocks = ace_step_fused.FusedAceStep.blocks
    monkeypatch.setattr(ace_step_fused.FusedAceStep, "blocks",
                        lambda self, *a: seen.append((a[0].shape[0], a[-1]))
                        or real_blocks(self, *a))  # fmt: skip
    requests = _requests(seed, 3, cfg=True)
    for r in requests:
        r.steps, r.negative = 2, None
    requests[0].cfg_type = "none"  # a plain row among the guided ones
    got = session_results(fused, requests, 2)
    assert any(split is not None and split < rows for rows, split in seen), seen
    for r, x in zip(requests, got):
        torch.testing.assert_close(x, _reference(fused, r), **TOL)


@pytest.mark.parametrize("fold", [False, True], ids=["direct", "folded"])
def test_fp8_blocks_track_diffusers_blocks(seed, fold, monkeypatch):
    """With ``FusedAceStep.fp8`` the QKV, cross-query, gate/up and down projections read float8
    rows that the norms and the SwiGLU gate wrote (their reference GEMM here: no FP8 GEMM on a
    CPU): the output follows diffusers' blocks to the precision of e4m3 operands, and every one
    of those projections took the FP8 route."""
    from stream_dit.model import ace_step_fused

    calls = []
    real_linear = ace_step_fused.fp8_linear
    monkeypatch.setattr(
        ace_step_fused, "fp8_linear", lambda *a, **k: calls.append(a[0].shape) or real_linear(*a, **k)
    )
    monkeypatch.setattr(ace_step_fused, "folds_cross_values", lambda *sizes: fold)
    monkeypatch.setenv(ace_step_fused.FP8_ENV_VAR, "1")
    fused = build_ace_step("tiny", seed=seed % 1000, fused=True)
    x, t, states, states_mask, frame_mask, context = _fused_inputs(seed)
    with torch.no_grad():
        got = fused(x, t, states, states_mask, frame_mask, context)
        fused.fused = False
        want = fused(x, t, states, states_mask, frame_mask, context)
    got, want = _real(got, frame_mask), _real(want, frame_mask)
    err = ((got - want).norm() / want.norm()).item()
    # e4m3 rounds each operand to within 2^-4 of itself; through the residual stream the tiny
    # model's output moves by 0.55-0.92 % (eight seeds), a stale quantized weight by 11-15 %
    assert err < 0.03, err
    assert torch.isfinite(got).all()
    layers = len(fused.transformer.layers)
    assert len(calls) == 4 * layers  # QKV, cross q, gate/up and down of every block
    # an in-place load of new weights reaches the quantized copies
    fused.fused = True
    layer = fused.transformer.layers[0]
    with torch.no_grad():
        layer.mlp.down_proj.weight.mul_(-3.0)
        again = fused(x, t, states, states_mask, frame_mask, context)
        fused.fused = False
        want_again = fused(x, t, states, states_mask, frame_mask, context)
    again, want_again = _real(again, frame_mask), _real(want_again, frame_mask)
    assert ((again - want_again).norm() / want_again.norm()).item() < 0.03


def _give_cross_out_bias(model: AceStepAdapter, seed: int) -> None:
    """A bias on every cross-attention output projection (the published model has none)."""
    gen = torch.Generator().manual_seed(seed)
    for layer in model.transformer.layers:
        proj = layer.cross_attn.to_out[0]
        proj.bias = torch.nn.Parameter(0.5 * torch.randn(proj.out_features, generator=gen))


def _real(out: torch.Tensor, frame_mask: torch.Tensor | None) -> torch.Tensor:
    """The frames of ``out`` a request owns (padded frames' outputs are discarded: the reference
    blocks give them an average over masked keys, the fused attention zeros)."""
    return out if frame_mask is None else out[frame_mask]


def test_fused_weights_stay_the_models_weights(seed):
    """The stacked projections are views the modules share: an in-place load reaches the fused
    path; a dtype change rebuilds it; an ONNX export traces the reference blocks."""
    model = build_ace_step("tiny", seed=1, fused=True)
    sa = model.transformer.layers[0].self_attn
    stacked = model.prepare().blocks_weights[0].qkv
    assert sa.to_k.weight.untyped_storage().data_ptr() == stacked.untyped_storage().data_ptr()
    other = build_ace_step("tiny", seed=2, fused=False)
    model.load_state_dict(other.state_dict())  # in place, into the views
    assert torch.equal(stacked[sa.to_q.weight.shape[0] :][: sa.to_k.weight.shape[0]],
                       other.transformer.layers[0].self_attn.to_k.weight)  # fmt: skip
    args = _fused_inputs(seed, rows=2)
    with torch.no_grad():
        torch.testing.assert_close(_real(model(*args), args[4]), _real(other(*args), args[4]),
                                   **TOL)  # fmt: skip
        model.to(torch.float16)  # new tensors: the views are gone
        assert model.prepare() is not None and not model._fused_model.stale()
        half = [a.half() if a.is_floating_point() else a for a in args]
        got = model(*half)
        model.fused = False
        want = model(*half)
        torch.testing.assert_close(_real(got, args[4]), _real(want, args[4]), rtol=2e-2, atol=2e-2)
        model.fused = True
        with AceStepAdapter.export_context():
            assert torch.equal(model(*half), want)  # the reference blocks, bit for bit


def test_cli_serve_and_demo_with_ace_step(monkeypatch, tmp_path, capsys):
    """``stream-dit serve --model ace-step`` serves the diffusers model; the demo runs it too."""
    pytest.importorskip("fastapi")
    uvicorn = pytest.importorskip("uvicorn")
    import numpy as np
    from fastapi.testclient import TestClient

    from stream_dit.cli import main

    apps = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: apps.append(app))
    argv = ["serve", "--model", "ace-step", "--device", "cpu", "--max-frames", "32"]
    assert main([*argv, "--max-cond-len", "8", "--depth", "2"]) == 0
    with TestClient(apps[0]) as client:
        # the server warms its engine first (503 "warming" until then)
        assert wait_for(lambda: client.get("/health").status_code == 200, timeout=120)
        body = {"frames": 11, "cond_seed": 1, "cond_len": 3, "steps": 2, "cfg_type": "full"}
        resp = client.post("/generate", json={**body, "guidance": 2.0})
        assert resp.status_code == 200, resp.text
        latent = np.load(io.BytesIO(resp.content))
        assert latent.shape == (11, 64) and np.isfinite(latent).all()
        assert client.post("/generate", json={**body, "frames": 40}).status_code == 400
    assert (
        main(["demo", "--model", "ace-step", "--output-dir", str(tmp_path), "--requests", "2"]) == 0
    )
    assert "ace-step: 2/2 requests" in capsys.readouterr().out


# ---------------------------------------------------------------- GPU: published size, engines
def _gpu_requests(n: int, cond_dim: int, *, cfg: bool) -> list[Request]:
    gen = torch.Generator().manual_seed(11)
    return [
        Request(
            frames=100 - 7 * (i % 3),  # odd and even T, padded frames in every batch
            cond=torch.randn(12 + 5 * (i % 2), cond_dim, generator=gen),
            context=torch.randn(100 - 7 * (i % 3), 128, generator=gen) if i % 2 else None,
            seed=i,
            steps=4,
            shift=3.0,
            **({"cfg_type": "full", "guidance": 3.0} if cfg else {}),
        )
        for i in range(n)
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [False, True], ids=["plain", "cfg"])
def test_published_size_bf16_session_matches_diffusers_on_gpu(cfg):
    """The published ACE-Step configuration in bf16: session at depth 1, 4, 8 vs the diffusers
    model driven per request in bf16. bf16 results depend on the batch (GEMM tiling), so the bound
    is relative to bf16's own error: at most 3x the distance of the bf16 reference from fp32."""
    check_bf16_session_parity(
        lambda dtype: build_ace_step("published", seed=0, device="cuda", dtype=dtype),
        _reference,
        lambda cond_dim: _gpu_requests(8, cond_dim, cfg=cfg),
    )


@pytest.mark.gpu
def test_fp8_session_tracks_bf16_on_gpu(monkeypatch):
    """The published size with FP8 projections (``STREAM_DIT_FP8=1``) serves the same requests
    as bf16 to within the error of e4m3 operands, in the default engine (CUDA graphs)."""
    from stream_dit.model import ace_step_fused

    out = {}
    for fp8 in ("0", "1"):
        monkeypatch.setenv(ace_step_fused.FP8_ENV_VAR, fp8)
        model = build_ace_step("published", seed=0, device="cuda", dtype=torch.bfloat16)
        engine = TorchEngine(model, max_batch=8, max_frames=256, max_cond_len=64)
        session = StreamSession(model, engine, depth=4)
        handles = [session.submit(r) for r in _gpu_requests(6, model.cond_dim, cfg=False)]
        session.run_until_idle()
        out[fp8] = [h.result for h in handles]
        assert model.prepare().fp8 == (fp8 == "1")
    for got, want in zip(out["1"], out["0"], strict=True):
        assert torch.isfinite(got).all()
        assert relative_distance(got, want) < 0.1, relative_distance(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["compile", "graphs", "compile-graphs"])
def test_engines_match_eager_on_gpu(mode):
    """torch.compile, CUDA graphs and both together serve the ACE-Step model like eager does
    (bf16, the small size; CFG at a ceiling of 8 rows for depth 4, padded frames)."""
    model = build_ace_step("small", seed=0, device="cuda", dtype=torch.bfloat16)
    requests = _gpu_requests(6, model.cond_dim, cfg=True)
    out = {}
    for m in ("eager", mode):
        engine = TorchEngine(model, max_batch=8, max_frames=128, max_cond_len=32, mode=m)
        session = StreamSession(model, engine, depth=4)
        handles = [session.submit(Request(**r.__dict__)) for r in requests]
        session.run_until_idle()
        out[m] = [h.result for h in handles]
    for got, want in zip(out[mode], out["eager"], strict=True):
        assert torch.isfinite(got).all()
        assert relative_distance(got, want) < 5e-2, relative_distance(got, want)
