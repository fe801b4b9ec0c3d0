"""Per-kernel time of one engine forward of the largest default model, rolled up into attention,
GEMM, norm and pointwise (tiny model on CPU).

    python3 packages/stream-dit/benchmarks/profile_forward.py --out profile.json [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from stream_dit.engines import TorchEngine
from stream_dit.model import build_model
from stream_dit.profiler import format_profile, profile_forward
from triton_dispatch.bench import BenchRecord, benchmark_arguments, environment, report


def main() -> None:
    parser = benchmark_arguments(__doc__.splitlines()[0])
    parser.add_argument("--preset", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    preset = args.preset or ("large" if on_gpu else "tiny")
    model = build_model(
        preset, seed=0, device=device, dtype=torch.bfloat16 if on_gpu else torch.float32
    )
    cases = [(8, 250), (16, 250)] if on_gpu else [(4, 50)]
    if args.quick:
        cases = cases[:1]
    records = []
    for rows, frames in cases:
        engine = TorchEngine(model, max_batch=rows, max_frames=frames, max_cond_len=64)
        res = profile_forward(engine, rows, frames, 64)
        print(f"{preset} rows={rows} frames={frames}: {format_profile(res)}")
        records.append(
            BenchRecord(
                name=f"forward_rollup_rows{rows}",
                shape={"preset": preset, "rows": rows, "frames": frames, "cond_len": 64},
                baseline="-",
                baseline_ms=None,
                ours_ms=res["total_ms"],
                env=environment(device),
                extra={
                    **res,
                    "gemm_plus_attention_fraction": res["fractions"]["gemm"]
                    + res["fractions"]["attention"],
                },
            )
        )
    report(records, args.out, meta={"command": " ".join(sys.argv)})


if __name__ == "__main__":
    main()
