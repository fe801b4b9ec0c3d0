"""Load test of ``stream-dit serve`` on loopback: concurrent, careless and hostile clients.

    python3 packages/stream-dit/benchmarks/serve_load.py --out serve_load.json [--quick]

Starts the server itself on 127.0.0.1, sends ``--clients`` concurrent requests (mixed frames, CFG on
and off, every 10th hanging up mid-upload or mid-request, every 7th malformed or oversized), then
stops it. Reports completed, 4xx, 5xx, p50/p99 latency, the server's RSS before and after, and
checks every completed latent against the same request run alone (``ours_ms``: p50 latency under
load; ``baseline_ms``: the same requests one at a time on the idle server).
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from stream_dit.serve_load import LoadConfig, run_load
from triton_dispatch.bench import BenchRecord, benchmark_arguments, environment, report


def main() -> None:
    parser = benchmark_arguments(__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--preset", default=None, help="default: small on CUDA, tiny on CPU")
    parser.add_argument("--frames", default=None, help="comma-separated frame counts to mix")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--dtype", default="float32", help="float32 keeps the alone check tight")
    args = parser.parse_args()
    on_gpu = torch.device(args.device).type == "cuda"
    frames = (50, 100, 250) if on_gpu else (16, 32, 64)
    if args.frames:
        frames = tuple(int(f) for f in args.frames.split(","))
    cfg = LoadConfig(
        clients=40 if args.quick else args.clients,
        preset=args.preset or ("small" if on_gpu else "tiny"),
        device=args.device,
        dtype=args.dtype,
        depth=args.depth,
        frames=frames,
        steps=args.steps or 8,
    )
    if args.dtype != "float32":  # batched and alone rows round differently at low precision
        cfg.atol = cfg.rtol = 5e-2
    res = run_load(cfg)
    print(res.table())
    record = BenchRecord(
        name="serve_load",
        shape={"clients": cfg.clients, "preset": cfg.preset, "frames": "/".join(map(str, frames))},
        baseline="same requests one at a time",
        baseline_ms=res.alone_ms,
        ours_ms=res.latency_ms["p50"],
        env=environment(args.device),
        extra=asdict(res),
    )
    report([record], args.out, meta={"command": " ".join(sys.argv)})
    ok = res.server_5xx == 0 and res.mismatched == 0 and res.completed > 0
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
