"""Tick throughput against the loops a user would otherwise write (used by ``stream-dit bench``
and ``benchmarks/tick.py``).

* ours: :class:`StreamSession` ticks, queue pre-filled so every tick is steady state;
* naive: each request denoised on its own, one forward (two with CFG) per step at batch 1;
* host-synced: a per-slot tick with two CFG passes that reads each slot's timestep back from the
  device and synchronises at the end of the tick, as hand-written servers often do.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from .engines import TorchEngine
from .model import FRAME_RATE, build_denoiser, default_preset
from .request import Request
from .schedule import flow_schedule
from .session import StreamSession


@dataclass
class BenchConfig:
    model: str = "dit"  # dit | ace-step | stable-audio
    preset: str | None = None  # None: the largest on CUDA (large / published), tiny on CPU
    depth: int = 4
    steps: int = 8
    ticks: int = 200
    warmup: int = 30
    frames: int = 250
    cond_len: int = 64
    cfg: bool = False
    engine: str = "torch"  # torch | compile | graphs | compile-graphs
    device: str = "cuda"
    dtype: str = "bfloat16"
    naive_requests: int = 4
    baselines: bool = True
    engine_warmup: bool = False  # run stream_dit.warmup on the engine before timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _requests(cfg: BenchConfig, n: int, cond_dim: int, device: torch.device) -> list[Request]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        kw = {}
        if cfg.cfg:
            kw = {
                "cfg_type": "full",
                "guidance": 4.0,
                "negative": torch.randn(cfg.cond_len // 2, cond_dim, generator=gen).to(device),
            }
        out.append(
            Request(
                frames=cfg.frames,
                cond=torch.randn(cfg.cond_len, cond_dim, generator=gen).to(device),
                seed=i,
                steps=cfg.steps,
                shift=3.0,
                **kw,
            )
        )
    return out


_MODELS: dict = {}


def build(cfg: BenchConfig):
    device = torch.device(cfg.device)
    dtype = getattr(torch, cfg.dtype)
    if cfg.preset is None:
        cfg.preset = default_preset(cfg.model, device)
    key = (cfg.model, cfg.preset, str(device), cfg.dtype)
    if key not in _MODELS:  # building a large model takes seconds; runs of one script share it
        _MODELS.clear()
        _MODELS[key] = build_denoiser(cfg.model, cfg.preset, seed=0, device=device, dtype=dtype)
    model = _MODELS[key]
    mode = "eager" if cfg.engine == "torch" else cfg.engine
    rows = cfg.depth * (2 if cfg.cfg else 1)
    engine = TorchEngine(
        model, max_batch=rows, max_frames=max(cfg.frames, 32), max_cond_len=cfg.cond_len, mode=mode
    )
    return model, engine


def time_session(cfg: BenchConfig, model, engine) -> dict:
    device = engine.device
    per_tick_finish = cfg.depth / cfg.steps
    n = int((cfg.ticks + cfg.warmup) * per_tick_finish) + 2 * cfg.depth + 2
    session = StreamSession(model, engine, depth=cfg.depth, max_queue=n + 1)
    for r in _requests(cfg, n, engine.cond_dim, device):
        session.submit(r)
    for _ in range(cfg.warmup):
        session.tick()
    _sync(device)
    finished = 0
    start = time.perf_counter()
    for _ in range(cfg.ticks):
        finished += len(session.tick())
    _sync(device)
    elapsed = time.perf_counter() - start
    rows = session.last_stats.rows
    frames = engine.frames_bucket(cfg.frames)
    length = engine.cond_bucket(cfg.cond_len)
    fwd_ms = forward_ms(engine, rows, frames, length, device, reps=max(cfg.ticks // 4, 10))
    tick_ms = elapsed / cfg.ticks * 1e3
    return {
        "tick_ms": tick_ms,
        "forward_ms": fwd_ms,
        "overhead_ms": tick_ms - fwd_ms,
        "overhead_fraction": (tick_ms - fwd_ms) / tick_ms,
        "rows_per_tick": rows,
        "passes_per_tick": session.last_stats.passes,
        "latents_per_s": finished / elapsed,
        "audio_x_realtime": finished * cfg.frames / FRAME_RATE / elapsed,
    }


def forward_ms(
    engine, rows: int, frames: int, length: int, device: torch.device, reps: int = 20
) -> float:
    """Median ms of one engine forward at a batch of ``rows`` (what a tick cannot go below)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(rows, frames, engine.latent_channels, generator=gen).to(device)
    t = torch.rand(rows, generator=gen).to(device)
    states = torch.randn(rows, length, engine.cond_dim, generator=gen).to(device)
    mask = torch.ones(rows, length, dtype=torch.bool, device=device)
    for _ in range(3):
        engine.forward(x, t, states, mask)
    times = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        engine.forward(x, t, states, mask)
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return times[len(times) // 2]


@torch.no_grad()
def time_naive(cfg: BenchConfig, engine) -> dict:
    """Each request on its own: batch-1 forwards, CFG as a second batch-1 forward."""
    device = engine.device
    reqs = _requests(cfg, cfg.naive_requests + 1, engine.cond_dim, device)
    sched = flow_schedule(cfg.steps, 3.0)

    def one(r: Request) -> torch.Tensor:
        x = torch.randn(
            1, r.frames, engine.latent_channels, generator=torch.Generator().manual_seed(r.seed)
        ).to(device)
        c, cm = r.cond[None], torch.ones(1, r.cond.shape[0], dtype=torch.bool, device=device)
        for k in range(len(sched) - 1):
            t = torch.full((1,), sched[k], device=device)
            v = engine.forward(x, t, c, cm)
            if cfg.cfg:
                v = v.clone()
                vn = engine.forward(
                    x,
                    t,
                    r.negative[None],
                    torch.ones(1, r.negative.shape[0], dtype=torch.bool, device=device),
                )
                v = vn + r.guidance * (v - vn)
            x = x + (sched[k + 1] - sched[k]) * v
        return x

    one(reqs[0])
    _sync(device)
    start = time.perf_counter()
    for r in reqs[1:]:
        one(r)
    _sync(device)
    elapsed = time.perf_counter() - start
    n = len(reqs) - 1
    return {"latents_per_s": n / elapsed, "audio_x_realtime": n * cfg.frames / FRAME_RATE / elapsed}


@torch.no_grad()
def time_host_synced(cfg: BenchConfig, engine) -> dict:
    """Per-slot tick: two CFG passes, per-slot host reads of the timestep, a sync per tick."""
    device = engine.device
    sched = torch.tensor(flow_schedule(cfg.steps, 3.0), device=device)
    n = int((cfg.ticks + cfg.warmup) * cfg.depth / cfg.steps) + 2 * cfg.depth + 2
    pending = _requests(cfg, n, engine.cond_dim, device)
    slots: list[dict | None] = [None] * cfg.depth
    ones = {}

    def mask(length: int) -> torch.Tensor:
        if length not in ones:
            ones[length] = torch.ones(length, dtype=torch.bool, device=device)
        return ones[length]

    def tick() -> int:
        for i in range(cfg.depth):
            if slots[i] is None and pending:
                r = pending.pop()
                x = torch.randn(
                    r.frames,
                    engine.latent_channels,
                    generator=torch.Generator().manual_seed(r.seed),
                ).to(device)
                slots[i] = {"r": r, "x": x, "k": 0}
        active = [s for s in slots if s is not None]
        xs = torch.stack([s["x"] for s in active])
        ts = torch.stack([sched[s["k"]] for s in active])
        c = torch.stack([s["r"].cond for s in active])
        v = engine.forward(xs, ts, c, mask(c.shape[1]).expand(len(active), -1)).clone()
        if cfg.cfg:
            neg = torch.stack([s["r"].negative for s in active])
            vn = engine.forward(xs, ts, neg, mask(neg.shape[1]).expand(len(active), -1)).clone()
        done = 0
        for j, s in enumerate(active):
            t, t_next = sched[s["k"]].item(), sched[s["k"] + 1].item()
            vj = v[j]
            if cfg.cfg:
                vj = vn[j] + s["r"].guidance * (vj - vn[j])
            s["x"] = s["x"] + (t_next - t) * vj
            s["k"] += 1
            if s["k"] == cfg.steps:
                slots[slots.index(s)] = None
                done += 1
        _sync(device)
        return done

    for _ in range(cfg.warmup):
        tick()
    _sync(device)
    finished = 0
    start = time.perf_counter()
    for _ in range(cfg.ticks):
        finished += tick()
    elapsed = time.perf_counter() - start
    return {
        "tick_ms": elapsed / cfg.ticks * 1e3,
        "latents_per_s": finished / elapsed,
        "audio_x_realtime": finished * cfg.frames / FRAME_RATE / elapsed,
    }


def run(cfg: BenchConfig) -> dict:
    """All measurements of one configuration, as a flat dict."""
    model, engine = build(cfg)
    out: dict = {"config": asdict(cfg)}
    if cfg.engine_warmup:
        from .warmup import warmup

        report = warmup(engine, frames=cfg.frames, cond_lens=cfg.cond_len, cfg=cfg.cfg)
        out["warmup"] = {
            "summary": str(report),
            "seconds": report.seconds,
            "forwards": report.forwards,
            "guidance_calls": report.guidance_calls,
            "graphs_captured": report.graphs_captured,
            "compiled_graphs": report.compiled_graphs,
            "triton_compiled": report.compiled,
        }
    out["session"] = time_session(cfg, model, engine)
    if cfg.baselines:
        out["naive"] = time_naive(cfg, engine)
        if engine.mode != "eager":
            # what a user without this runtime most often runs: the model called eagerly
            eager = TorchEngine(
                model,
                max_batch=engine.max_batch,
                max_frames=engine.max_frames,
                max_cond_len=engine.max_cond_len,
            )
            out["naive_eager"] = time_naive(cfg, eager)
            out["speedup_vs_naive_eager"] = (
                out["session"]["latents_per_s"] / out["naive_eager"]["latents_per_s"]
            )
        out["host_synced"] = time_host_synced(cfg, engine)
        out["speedup_vs_naive"] = out["session"]["latents_per_s"] / out["naive"]["latents_per_s"]
        out["tick_speedup_vs_host_synced"] = (
            out["host_synced"]["tick_ms"] / out["session"]["tick_ms"]
        )
    return out


def format_result(res: dict) -> str:
    s = res["session"]
    c = res["config"]
    lines = [
        f"{c['model']}/{c['preset']} depth={c['depth']} steps={c['steps']} frames={c['frames']} cfg={c['cfg']} engine={c['engine']} on {c['device']}",
        f"  tick {s['tick_ms']:.3f} ms ({s['rows_per_tick']} rows, {s['passes_per_tick']} pass), engine forward {s['forward_ms']:.3f} ms, "
        f"overhead {s['overhead_ms']:.3f} ms ({100 * s['overhead_fraction']:.1f}%)",
        f"  {s['latents_per_s']:.2f} latents/s, audio x{s['audio_x_realtime']:.1f} realtime",
    ]
    if "naive" in res:
        lines.append(
            f"  naive per-request loop: {res['naive']['latents_per_s']:.2f} latents/s -> session x{res['speedup_vs_naive']:.2f}"
        )
        if "naive_eager" in res:
            lines.append(
                f"  naive loop, eager model: {res['naive_eager']['latents_per_s']:.2f} latents/s -> session x{res['speedup_vs_naive_eager']:.2f}"
            )
        lines.append(
            f"  per-slot two-pass host-synced tick: {res['host_synced']['tick_ms']:.3f} ms -> session x{res['tick_speedup_vs_host_synced']:.2f}"
        )
    return "\n".join(lines)
