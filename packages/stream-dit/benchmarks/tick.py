"""Tick throughput of StreamSession against a naive per-request loop and a per-slot two-pass-CFG
host-synced tick, for each model and engine variant asked for (on CPU: the tiny sizes, eager).

    python3 packages/stream-dit/benchmarks/tick.py --out tick.json [--quick]
        [--models ace-step,dit] [--engines graphs,compile-graphs,compile,eager] [--frames N]

Defaults on CUDA: ``--models ace-step,dit`` (ACE-Step 1.5's diffusers transformer at its published
size, the built-in DiT ``large``), ``--engines graphs`` (what ``TorchEngine``'s default ``auto``
mode runs on CUDA), bf16, 250 frames (10 s of audio; ``--frames 1500``: 60 s), 8 steps. The table's
TFLOP/s is the Linear and convolution FLOPs of the tick's forward over the tick time.
Records per (model, engine), ``ours_ms``/``baseline_ms`` being ms per finished latent for throughput
cases and ms per tick for tick cases (``extra`` holds the raw figures and the targets):
  * throughput at depth 8 vs the naive loop through the same engine (target >= 4x),
  * fused CFG tick at depth 8 (and 4 without --quick) vs the per-slot two-pass host-synced tick
    (target >= 1.5x),
  * runtime overhead: tick time minus the engine forward at that batch (target < 5% of the tick).
A short table of every variant is printed last.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from stream_dit.benchmark import BenchConfig, format_result, run
from stream_dit.engines.torch_engine import MODES
from stream_dit.model import MODELS, build_denoiser, default_preset
from stream_dit.profiler import linear_flops
from triton_dispatch.bench import BenchRecord, benchmark_arguments, environment, report


def _list(value: str, allowed: tuple[str, ...], name: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise SystemExit(f"--{name}: {bad or value!r} not in {allowed}")
    return items


_FLOPS: dict = {}


def _forward_flops(model: str, preset: str, device, dtype, rows: int, frames: int, length: int):
    """Linear and convolution FLOPs of one forward of ``rows`` rows (kept per shape)."""
    key = (model, preset, rows, frames, length)
    if key not in _FLOPS:
        adapter = build_denoiser(model, preset, seed=0, device=device, dtype=dtype)
        gen = torch.Generator().manual_seed(0)
        inputs = (
            torch.randn(rows, frames, adapter.latent_channels, generator=gen).to(device),
            torch.rand(rows, generator=gen).to(device),
            torch.randn(rows, length, adapter.cond_dim, generator=gen).to(device),
            torch.ones(rows, length, dtype=torch.bool, device=device),
        )
        _FLOPS[key] = linear_flops(adapter, *inputs)
        del adapter
    return _FLOPS[key]


def _variant(args, model: str, engine: str, device: torch.device, env: dict) -> tuple[list, dict]:
    on_gpu = device.type == "cuda"
    preset = default_preset(model, device)
    ticks, warmup = (60, 15) if args.quick else (150, 25)
    if not on_gpu:
        ticks, warmup = 4, 1
    frames = args.frames or (250 if on_gpu else 12)
    common = dict(
        model=model,
        preset=preset,
        steps=8 if on_gpu else 2,
        ticks=ticks,
        warmup=warmup,
        frames=frames,
        engine=engine,
        device=str(device),
        dtype="bfloat16" if on_gpu else "float32",
        naive_requests=2 if args.quick else 4,
        cond_len=64 if on_gpu else 4,
    )
    shape = {"model": model, "preset": preset, "engine": engine, "frames": frames, "steps": 8}
    records, row = [], {"model": f"{model}/{preset}", "engine": engine}
    start = time.perf_counter()

    dtype = torch.bfloat16 if on_gpu else torch.float32

    def tflops(rows: int, tick_ms: float) -> float:
        flops = _forward_flops(model, preset, device, dtype, rows, frames, common["cond_len"])
        return flops / tick_ms / 1e9

    res = run(BenchConfig(depth=8, cfg=False, **common))
    print(format_result(res), flush=True)
    s, nv = res["session"], res["naive"]
    res["tick_tflops"] = tflops(s["rows_per_tick"], s["tick_ms"])
    row.update(
        tick_ms=s["tick_ms"],
        latents_per_s=s["latents_per_s"],
        realtime=s["audio_x_realtime"],
        vs_naive=res["speedup_vs_naive"],
        tflops=res["tick_tflops"],
    )
    records.append(
        BenchRecord(
            name=f"throughput_depth8_vs_naive[{model},{engine}]",
            shape={**shape, "depth": 8},
            baseline=f"naive per-request loop, same {engine} engine",
            baseline_ms=1e3 / nv["latents_per_s"],
            ours_ms=1e3 / s["latents_per_s"],
            env=env,
            extra={"target": ">= 4x", "reached": res["speedup_vs_naive"] >= 4, **res},
        )
    )
    records.append(
        BenchRecord(
            name=f"runtime_overhead_depth8[{model},{engine}]",
            shape={**shape, "depth": 8, "rows": s["rows_per_tick"]},
            baseline="engine forward alone",
            baseline_ms=s["forward_ms"],
            ours_ms=s["tick_ms"],
            env=env,
            extra={
                "target": "< 5% of tick",
                "overhead_fraction": s["overhead_fraction"],
                "reached": s["overhead_fraction"] < 0.05,
            },
        )
    )
    for depth in (8,) if args.quick else (8, 4):
        res = run(BenchConfig(depth=depth, cfg=True, **common))
        print(format_result(res), flush=True)
        s, hs = res["session"], res["host_synced"]
        ratio = res["tick_speedup_vs_host_synced"]
        res["tick_tflops"] = tflops(s["rows_per_tick"], s["tick_ms"])
        if depth == 8:
            row.update(cfg_tick_ms=s["tick_ms"], cfg_vs_two_pass=ratio)
        records.append(
            BenchRecord(
                name=f"fused_cfg_tick_depth{depth}[{model},{engine}]",
                shape={**shape, "depth": depth, "rows": s["rows_per_tick"]},
                baseline="per-slot two-pass host-synced tick",
                baseline_ms=hs["tick_ms"],
                ours_ms=s["tick_ms"],
                env=env,
                extra={"target": ">= 1.5x", "reached": ratio >= 1.5, **res},
            )
        )
    row["wall_s"] = time.perf_counter() - start
    return records, row


def _table(rows: list[dict]) -> str:
    head = (
        "| model | engine | ms/tick d8 | TFLOP/s | latents/s | x realtime | d8 vs naive (>=4x) "
        "| CFG ms/tick d8 | fused CFG vs two-pass d8 (>=1.5x) | wall s |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['engine']} | failed: {r['error']} ||||||||")
            continue
        lines.append(
            f"| {r['model']} | {r['engine']} | {r['tick_ms']:.2f} | {r['tflops']:.0f} "
            f"| {r['latents_per_s']:.1f} "
            f"| {r['realtime']:.0f} | {r['vs_naive']:.2f}x | {r.get('cfg_tick_ms', float('nan')):.2f} "
            f"| {r.get('cfg_vs_two_pass', float('nan')):.2f}x | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = benchmark_arguments(__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help=f"comma list of {MODELS}")
    parser.add_argument("--engines", default=None, help=f"comma list of {MODES}")
    parser.add_argument("--frames", type=int, default=None, help="latent frames per request")
    args = parser.parse_args()
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    models = _list(args.models or ("ace-step,dit" if on_gpu else "dit"), MODELS, "models")
    engines = _list(args.engines or ("graphs" if on_gpu else "eager"), MODES, "engines")
    if not on_gpu:
        engines = ["eager"]
    env = environment(device)
    records, rows = [], []
    for model in models:
        for engine in engines:
            try:
                recs, row = _variant(args, model, engine, device, env)
            except Exception as exc:  # one failing variant must not lose the others' figures
                print(f"{model} {engine}: {type(exc).__name__}: {exc}", flush=True)
                rows.append({"model": model, "engine": engine, "error": type(exc).__name__})
                continue
            records += recs
            rows.append(row)
            if on_gpu:
                torch.cuda.empty_cache()
    report(records, args.out, meta={"command": " ".join(sys.argv), "table": rows})
    print(_table(rows))


if __name__ == "__main__":
    main()
