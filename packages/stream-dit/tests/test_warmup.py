"""The engine warm-up: what it runs, that it leaves the session as it was, and the server's
readiness while it runs."""

import importlib
import threading
import time

import pytest
import torch

from stream_dit import Request, StreamSession, StreamWarmupReport, TorchEngine, warmup
from stream_dit.session import TickStats
from stream_dit.warmup import forward_shapes
from triton_dispatch.warmup import WarmupReport

warmup_module = importlib.import_module("stream_dit.warmup")


def _session(model, depth=2, max_queue=4):
    engine = TorchEngine(model, max_batch=2 * depth, max_frames=16, max_cond_len=8)
    return StreamSession(model, engine, depth=depth, max_queue=max_queue)


def _requests():
    gen = torch.Generator().manual_seed(3)

    def cond(n):
        return torch.randn(n, 32, generator=gen)

    guided = {"cfg_type": "full", "guidance": 3.0}
    return [
        Request(frames=12, cond=cond(5), seed=1, steps=3, negative=cond(2), **guided),
        Request(frames=9, cond=cond(8), seed=2, steps=2, cfg_type="full", guidance=2.0),
        Request(frames=16, cond=cond(3), seed=3, steps=3, noise=[0.3, 0.1]),
        Request(frames=7, cond=cond(4), seed=4, steps=2),
    ]


def _snapshot(session):
    cache = session._cond_cache
    return {
        "state": session.state.clone(),
        "active": session.active,
        "queued": session.queued,
        "ticks": session.ticks,
        "stats": session.last_stats,
        "cond_cache": (len(cache), cache.hits, cache.misses),
        "caches": (len(session._index_cache), len(session._mask_cache), len(session._rows_cache)),
    }


def test_warmup_runs_every_row_count_and_the_guidance_kernel(tiny_model):
    session = _session(tiny_model)
    report = warmup(session)
    assert isinstance(report, StreamWarmupReport) and isinstance(report, WarmupReport)
    # eager engine: rows 1..2*depth at the engine's largest T and L; a mask only with >1 row
    assert report.shapes == (
        (1, 16, 8, False),
        (2, 16, 8, False),
        (2, 16, 8, True),
        (3, 16, 8, False),
        (3, 16, 8, True),
        (4, 16, 8, False),
        (4, 16, 8, True),
    )
    assert report.forwards == 7 and report.guidance_calls == 2  # 1 and 2 guided rows
    assert report.calls == report.forwards + report.guidance_calls and report.seconds > 0
    assert report.graphs_captured == 0
    line = str(report)
    assert line.startswith("warm-up: 7 engine forwards and 2 fused guidance calls")
    assert "\n" not in line
    assert warmup(session, cfg=False).guidance_calls == 0
    assert warmup(_session(tiny_model), cfg=False).shapes[-1][0] == 2  # rows up to depth


def test_shapes_follow_the_engines_buckets(tiny_model, monkeypatch):
    # only the shapes are listed here, nothing runs: spare the test the compiler's import
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    compiled = TorchEngine(tiny_model, max_batch=8, max_frames=64, max_cond_len=32, mode="compile")
    # 3 rows pad to a batch of 4; 10 frames pad to 32 (always masked), 32 frames may be mixed
    assert forward_shapes(compiled, frames=[10, 32], cond_lens=[3, 5], rows=3) == [
        (4, 32, 16, False),
        (4, 32, 16, True),
    ]
    rows = [s[0] for s in forward_shapes(compiled, frames=64, cond_lens=32)]
    assert rows == [1, 2, 2, 4, 4, 8, 8]
    eager = TorchEngine(tiny_model, max_batch=4, max_frames=16, max_cond_len=8)
    assert forward_shapes(eager, frames=[5, 5], cond_lens=0, rows=[1]) == [(1, 5, 1, False)]
    with pytest.raises(ValueError, match="frames must lie in"):
        warmup(eager, frames=17)
    with pytest.raises(ValueError, match="rows must lie in"):
        warmup(eager, rows=[5])
    with pytest.raises(ValueError, match="cond_lens"):
        warmup(eager, cond_lens=[])
    with pytest.raises(TypeError, match="StreamSession or an Engine"):
        warmup(tiny_model)


def test_warmup_leaves_the_session_and_its_results_unchanged(tiny_model):
    warm, cold = _session(tiny_model), _session(tiny_model)
    before = _snapshot(warm)
    rng = torch.get_rng_state()
    report = warmup(warm, frames=[12, 16], cond_lens=8)
    assert report.forwards > 0 and report.guidance_calls > 0
    after = _snapshot(warm)
    assert torch.equal(after.pop("state"), before.pop("state"))
    assert after == before and after["stats"] == TickStats()
    assert torch.equal(torch.get_rng_state(), rng)
    assert warm.idle and all(slot is None for slot in warm._slots)
    hw = [warm.submit(r) for r in _requests()]
    hc = [cold.submit(r) for r in _requests()]
    assert [h.id for h in hw] == [h.id for h in hc] == [0, 1, 2, 3]
    warm.run_until_idle()
    cold.run_until_idle()
    assert warm.ticks == cold.ticks
    for a, b in zip(hw, hc):
        assert a.result is not None and torch.equal(a.result, b.result)


# ------------------------------------------------------------------ the server
fastapi = pytest.importorskip("fastapi")
testclient = pytest.importorskip("fastapi.testclient")

from stream_dit.server import create_app  # noqa: E402

BODY = {"frames": 6, "cond_seed": 1, "cond_len": 3, "steps": 2}


def _until(client, predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        resp = client.get("/health")
        if predicate(resp):
            return resp
        time.sleep(0.01)
    raise AssertionError(f"/health never got there: {resp.status_code} {resp.text}")


def test_health_is_503_warming_until_the_warmup_finished(tiny_model):
    session = _session(tiny_model)
    started, release = threading.Event(), threading.Event()

    def slow_warmup(s):
        assert s is session
        started.set()
        assert release.wait(30)
        return "warm-up: done in the test"

    with testclient.TestClient(create_app(session, warmup=slow_warmup)) as client:
        assert started.wait(10)
        resp = client.get("/health")  # answered while the warm-up runs
        assert resp.status_code == 503
        assert resp.json()["ready"] is False and resp.json()["state"] == "warming"
        early = client.post("/generate", json=BODY)
        assert early.status_code == 503 and early.headers["retry-after"] == "1"
        assert "not ready (warming)" in early.text and session.queued == 0
        release.set()
        resp = _until(client, lambda r: r.status_code == 200)
        body = resp.json()
        assert body["ready"] is True and body["state"] == "ready"
        assert body["warmup"] == "warm-up: done in the test"
        assert client.post("/generate", json=BODY).status_code == 200


def test_server_runs_the_real_warmup_by_default(tiny_model, monkeypatch):
    calls = []
    real = warmup_module.warmup

    def spy(session, **kw):
        calls.append(session)
        return real(session, **kw)

    monkeypatch.setattr(warmup_module, "warmup", spy)
    session = _session(tiny_model, depth=1)
    with testclient.TestClient(create_app(session)) as client:
        body = _until(client, lambda r: r.status_code == 200).json()
    assert calls == [session]
    assert body["warmup"].startswith("warm-up: 3 engine forwards and 1 fused")
    assert session.ticks == 0 and session.idle


def test_failed_warmup_keeps_the_server_unready(tiny_model):
    def broken(session):
        raise RuntimeError("no engine today")

    with testclient.TestClient(create_app(_session(tiny_model), warmup=broken)) as client:
        body = _until(client, lambda r: r.json()["state"] != "warming").json()
        assert body["state"] == "failed" and body["ready"] is False
        assert "no engine today" in body["error"]
        resp = client.post("/generate", json=BODY)
        assert resp.status_code == 503 and "warm-up failed" in resp.text
        assert "retry-after" not in resp.headers


def test_without_warmup_the_server_is_ready_at_once(tiny_model):
    with testclient.TestClient(create_app(_session(tiny_model), warmup=False)) as client:
        body = client.get("/health").json()
        assert body["state"] == "ready" and body["warmup"] is None


# ------------------------------------------------------------------ the CLI
def test_serve_help_documents_the_warmup(capsys):
    from stream_dit.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for flag in ("--warmup", "--no-warmup", "--warmup-frames", "--warmup-cond-len"):
        assert flag in out


@pytest.mark.parametrize("flag", ["--warmup", "--no-warmup"])
def test_serve_warms_up_and_prints_the_report(flag, monkeypatch, capsys):
    import uvicorn

    from stream_dit.cli import main

    seen = {}

    def run(app, **kw):  # stands in for the server: start the app, wait until it is ready
        with testclient.TestClient(app) as client:
            seen["health"] = _until(client, lambda r: r.status_code == 200).json()

    monkeypatch.setattr(uvicorn, "run", run)
    argv = ["serve", "--device", "cpu", "--depth", "1", "--max-frames", "8", "--max-cond-len", "4"]
    assert main([*argv, flag, "--warmup-frames", "8", "6"]) == 0
    err = capsys.readouterr().err
    if flag == "--warmup":
        assert "warm-up: " in err and seen["health"]["warmup"] in err
    else:
        assert "warm-up" not in err and seen["health"]["warmup"] is None


def test_bench_and_demo_take_a_warmup(tmp_path, capsys):
    import json

    from stream_dit.cli import main

    out = tmp_path / "bench.json"
    argv = ["bench", "--depth", "1", "--steps", "1", "--ticks", "1", "--warmup", "0", "--cfg"]
    argv += ["--frames", "8", "--cond-len", "4", "--preset", "tiny", "--device", "cpu"]
    assert main([*argv, "--no-baselines", "--engine-warmup", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["warmup"]["forwards"] == 3 and res["warmup"]["guidance_calls"] == 1
    assert res["warmup"]["summary"] in capsys.readouterr().err
    demo = ["demo", "--output-dir", str(tmp_path), "--requests", "1", "--depth", "1", "--warmup"]
    assert main(demo) == 0
    assert "warm-up: " in capsys.readouterr().err
    assert json.loads((tmp_path / "stream_dit_demo.json").read_text())["warmup_s"] > 0
