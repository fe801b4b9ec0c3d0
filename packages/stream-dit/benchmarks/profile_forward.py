"""Per-kernel time of one engine forward, rolled up into attention, GEMM, norm and pointwise, and
the forward's time against its batch (how far batching rows is from free).

    python3 packages/stream-dit/benchmarks/profile_forward.py --out profile.json [--quick]
        [--model dit|ace-step] [--preset NAME] [--engine eager|compile] [--rows 1,8,16]

Defaults: the largest size of the model on CUDA (the tiny one on CPU), eager, rows 8 and 16 at
250 frames. ``ours_ms`` is the profiled forward's kernel time; ``extra["top"]`` its largest kernels
and ``extra["forward_ms_by_rows"]`` the timed forward (``do_bench`` median) at 1..max rows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from stream_dit.engines import TorchEngine
from stream_dit.model import MODELS, build_denoiser, default_preset
from stream_dit.profiler import format_profile, profile_forward
from triton_dispatch.bench import BenchRecord, benchmark_arguments, environment, report


def _forward_ms(engine: TorchEngine, rows: int, frames: int, cond_len: int) -> float:
    gen = torch.Generator().manual_seed(0)
    dev = engine.device
    x = torch.randn(rows, frames, engine.latent_channels, generator=gen).to(dev)
    t = torch.rand(rows, generator=gen).to(dev)
    states = torch.randn(rows, cond_len, engine.cond_dim, generator=gen).to(dev)
    mask = torch.ones(rows, cond_len, dtype=torch.bool, device=dev)
    if dev.type != "cuda":
        return float("nan")
    import triton.testing

    return float(triton.testing.do_bench(lambda: engine.forward(x, t, states, mask), rep=200))


def main() -> None:
    parser = benchmark_arguments(__doc__.splitlines()[0])
    parser.add_argument("--model", default="dit", choices=MODELS)
    parser.add_argument("--preset", default=None)
    parser.add_argument("--engine", default="eager", choices=("eager", "compile"))
    parser.add_argument("--rows", default=None, help="comma list of batch rows to profile")
    args = parser.parse_args()
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    preset = args.preset or default_preset(args.model, device)
    model = build_denoiser(
        args.model,
        preset,
        seed=0,
        device=device,
        dtype=torch.bfloat16 if on_gpu else torch.float32,
    )
    frames = 250 if on_gpu else 50
    rows_list = (
        [int(r) for r in args.rows.split(",")] if args.rows else ([8, 16] if on_gpu else [4])
    )
    if args.quick:
        rows_list = rows_list[:1]
    records = []
    for rows in rows_list:
        engine = TorchEngine(
            model, max_batch=rows, max_frames=frames, max_cond_len=64, mode=args.engine
        )
        res = profile_forward(engine, rows, frames, 64, top=25)
        scaling = {
            r: _forward_ms(engine, r, frames, 64) for r in sorted({1, 2, 4, rows}) if r <= rows
        }
        label = f"{args.model}/{preset} {args.engine} rows={rows} frames={frames}"
        print(f"{label}: {format_profile(res)}")
        print("  forward ms by rows: " + ", ".join(f"{r}: {ms:.3f}" for r, ms in scaling.items()))
        for entry in res["top"]:
            print(f"    {entry['ms']:8.3f} ms  {entry['category']:<10} {entry['name'][:100]}")
        records.append(
            BenchRecord(
                name=f"forward_rollup_rows{rows}",
                shape={
                    "model": args.model,
                    "preset": preset,
                    "engine": args.engine,
                    "rows": rows,
                    "frames": frames,
                    "cond_len": 64,
                },
                baseline="-",
                baseline_ms=None,
                ours_ms=res["total_ms"],
                env=environment(device),
                extra={
                    **res,
                    "forward_ms_by_rows": scaling,
                    "gemm_plus_attention_fraction": res["fractions"]["gemm"]
                    + res["fractions"]["attention"],
                },
            )
        )
    report(records, args.out, meta={"command": " ".join(sys.argv)})


if __name__ == "__main__":
    main()
