"""Per-kernel time of one engine forward, rolled up into attention, GEMM, norm and pointwise, with
the forward's achieved TFLOP/s against the card's measured dense-GEMM rate, and the forward's
time against its batch (how far batching rows is from free).

    python3 packages/stream-dit/benchmarks/profile_forward.py --out profile.json [--quick]
        [--model dit|ace-step|stable-audio] [--preset NAME] [--engine eager|compile|graphs|
        compile-graphs] [--rows 8,16] [--frames 1500] [--cond-len 64] [--reference]

Defaults: ACE-Step (the built-in DiT without diffusers), the largest size of the model on CUDA
(the tiny one on CPU), the default engine
(eager, which runs the fused block kernels on CUDA), rows 8 and 16 at 1500 frames (60 s of
ACE-Step audio: one depth-8 tick without and with CFG). ``--reference`` runs the model's
reference blocks (``fused=False``) for comparison. ``ours_ms`` is the timed forward (``do_bench``
median); ``extra`` holds the profiled kernel time by category, its largest kernels, the Linear
and convolution FLOPs, the TFLOP/s they reach, that as a fraction of the card's GEMM rate, the
wall time per call, and the timed forward at 1..max rows.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from stream_dit.engines import TorchEngine
from stream_dit.engines.torch_engine import MODES
from stream_dit.model import MODELS, build_denoiser, default_preset
from stream_dit.profiler import dense_gemm_rate, format_profile, linear_flops, profile_forward
from triton_dispatch.bench import (
    BenchRecord,
    benchmark_arguments,
    environment,
    median_ms,
    report,
    wall_ms_per_call,
)


def _inputs(engine: TorchEngine, rows: int, frames: int, cond_len: int) -> tuple:
    gen = torch.Generator().manual_seed(0)
    dev = engine.device
    x = torch.randn(rows, frames, engine.latent_channels, generator=gen).to(dev)
    t = torch.rand(rows, generator=gen).to(dev)
    states = torch.randn(rows, cond_len, engine.cond_dim, generator=gen).to(dev)
    mask = torch.ones(rows, cond_len, dtype=torch.bool, device=dev)
    return x, t, states, mask


def _timed(engine: TorchEngine, rows: int, frames: int, cond_len: int) -> tuple[float, float]:
    """(median ms, wall ms per call over 10 back-to-back calls) of one forward."""
    inputs = _inputs(engine, rows, frames, cond_len)
    on_gpu = engine.device.type == "cuda"

    def forward():
        return engine.forward(*inputs)

    ms = median_ms(forward, device=engine.device, rep=300 if on_gpu else 5)
    return ms, wall_ms_per_call(forward, device=engine.device, calls=10, warmup=2)


def main() -> None:
    parser = benchmark_arguments(__doc__.splitlines()[0])
    has_diffusers = importlib.util.find_spec("diffusers") is not None
    parser.add_argument("--model", default="ace-step" if has_diffusers else "dit", choices=MODELS)
    parser.add_argument("--preset", default=None)
    parser.add_argument("--engine", default="eager", choices=MODES)
    parser.add_argument("--rows", default=None, help="comma list of batch rows to profile")
    parser.add_argument("--frames", type=int, default=None)
    parser.add_argument("--cond-len", type=int, default=64)
    parser.add_argument("--reference", action="store_true", help="the model's reference blocks")
    args = parser.parse_args()
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    preset = args.preset or default_preset(args.model, device)
    model = build_denoiser(
        args.model, preset, seed=0, device=device,
        dtype=torch.bfloat16 if on_gpu else torch.float32,
    )  # fmt: skip
    if args.reference and hasattr(model, "fused"):
        model.fused = False
    frames = args.frames or (1500 if on_gpu else 50)
    rows_list = (
        [int(r) for r in args.rows.split(",")] if args.rows else ([8, 16] if on_gpu else [4])
    )
    if args.quick:
        rows_list = rows_list[:1]
    rate = dense_gemm_rate(device) if on_gpu else float("nan")
    records = []
    for rows in rows_list:
        engine = TorchEngine(model, max_batch=rows, max_frames=frames,
                             max_cond_len=args.cond_len, mode=args.engine)  # fmt: skip
        inputs = _inputs(engine, rows, frames, args.cond_len)
        flops = linear_flops(model, *inputs)
        res = profile_forward(engine, rows, frames, args.cond_len, top=25)
        ms, wall = _timed(engine, rows, frames, args.cond_len)
        tflops = flops / ms / 1e9
        scaling = {
            r: _timed(engine, r, frames, args.cond_len)[0]
            for r in sorted({1, 2, 4, rows})
            if r <= rows and not args.quick
        }
        label = f"{args.model}/{preset} {args.engine} rows={rows} frames={frames}"
        print(f"{label}: {ms:.3f} ms (wall {wall:.3f}), {flops / 1e12:.2f} TFLOP of GEMMs, "
              f"{tflops:.0f} TFLOP/s = {tflops / rate:.0%} of the card's {rate:.0f}")  # fmt: skip
        print(f"  profiled {format_profile(res)}")
        print("  forward ms by rows: " + ", ".join(f"{r}: {v:.3f}" for r, v in scaling.items()))
        for entry in res["top"]:
            print(f"    {entry['ms']:8.3f} ms  {entry['category']:<10} {entry['name'][:100]}")
        records.append(
            BenchRecord(
                name=f"forward_rows{rows}",
                shape={
                    "model": args.model,
                    "preset": preset,
                    "engine": args.engine,
                    "reference_blocks": args.reference,
                    "rows": rows,
                    "frames": frames,
                    "cond_len": args.cond_len,
                },
                baseline="-",
                baseline_ms=None,
                ours_ms=ms,
                env=environment(device),
                extra={
                    **res,
                    "wall_ms": wall,
                    "linear_tflop": flops / 1e12,
                    "tflops": tflops,
                    "gemm_rate_tflops": rate,
                    "fraction_of_gemm_rate": tflops / rate,
                    "forward_ms_by_rows": scaling,
                    "gemm_plus_attention_fraction": res["fractions"]["gemm"]
                    + res["fractions"]["attention"],
                },
            )
        )
        del engine
    report(records, args.out, meta={"command": " ".join(sys.argv)})


if __name__ == "__main__":
    main()
