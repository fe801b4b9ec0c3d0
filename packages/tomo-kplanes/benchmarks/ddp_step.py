"""Steps per second of ``reconstruct`` at the 200³ configuration (T=4 rotations, C=32, one scale,
linear decoder, 1024 rays × 200 samples, volume TV on 10,000 points) on N ranks, the global batch
split over them (strong scaling). Launch once with one process and once with two:

    python3 -m torch.distributed.run --nproc_per_node=1 packages/tomo-kplanes/benchmarks/ddp_step.py --out tomo1.json
    python3 -m torch.distributed.run --nproc_per_node=2 packages/tomo-kplanes/benchmarks/ddp_step.py --out tomo2.json

Each case times ``reconstruct`` itself, the loop a user runs: a short run first (compiles the
kernels, captures the CUDA graph), then runs of ``--steps`` and ``2 x --steps`` steps; the time per
step is the difference of the two wall times over ``--steps``, so setup and capture cancel out.
Cases: the default step (one CUDA graph per step, collective included, under NCCL) and the eager
step. Also: the gradient all-reduce alone (one flat buffer of every parameter's gradient, timed
over a fixed count on every rank) against the step, and whether the replicas hold identical
parameters after the runs. Rank 0 writes the JSON. ``--profile``: where each rank's step time
goes (runs of ``steps`` and ``2 x steps`` steps profiled, the difference per step). ``--tiny``:
small shapes on CPU (gloo).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from tomo_kplanes.geometry import TiltGeometry, tilt_range
from tomo_kplanes.objective import LossWeights
from tomo_kplanes.train import ReconstructionConfig, reconstruct
from triton_dispatch.bench import format_profile, profile_step, synchronize


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file written by rank 0")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rays", type=int, default=1024, help="rays per step (the global batch)")
    p.add_argument("--tiny", action="store_true", help="small shapes on the CPU (gloo)")
    p.add_argument("--profile", action="store_true", help="where each step's time goes")
    return p.parse_args()


def _run(series, geo, config, steps, device):
    synchronize(device)
    dist.barrier()
    t0 = time.perf_counter()
    result = reconstruct(series, geo, ReconstructionConfig(**{**config, "steps": steps}))
    synchronize(device)
    return time.perf_counter() - t0, result


def per_step_profile(short: dict, long: dict, steps: int) -> dict:
    """Per step: ``profile_step``'s figures of a run of ``2 * steps`` steps less those of a run of
    ``steps`` (setup and graph capture cancel, as in the timing)."""
    out = {
        k: (v - short[k]) / steps
        for k, v in long.items()
        if k.endswith("_ms") and k != "host_ms" and k in short
    }
    before = {t["kernel"]: t for t in short.get("top", [])}
    top = []
    for t in long.get("top", []):
        b = before.get(t["kernel"], {"ms": 0.0, "per_call": 0.0})
        top.append({"kernel": t["kernel"], "ms": (t["ms"] - b["ms"]) / steps,
                    "per_call": (t["per_call"] - b["per_call"]) / steps})  # fmt: skip
    out["top"] = sorted(top, key=lambda t: -t["ms"])[:8]
    return out


def main() -> None:
    args = _args()
    backend = "gloo" if args.tiny or not torch.cuda.is_available() else "nccl"
    local = int(os.environ.get("LOCAL_RANK", 0))
    if backend == "nccl":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group(backend, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.tiny:
        res, channels, rotations, rays, samples, tv, steps = 16, 4, 2, 64, 16, 64, 3
    else:
        res, channels, rotations, rays, samples, tv, steps = (
            200,
            32,
            4,
            args.rays,
            200,
            10_000,
            args.steps,
        )
    config = dict(
        resolution=res, channels=channels, rotations=rotations, rays_per_batch=rays,
        samples_per_ray=samples, tv_points=tv, weights=LossWeights(volume_tv=1e-3, plane_tv=1e-4),
        warmup_steps=5, eval_every=0, holdout_fraction=0.0, progress=False,
    )  # fmt: skip
    geo = TiltGeometry(tilt_range(60, 2), (res, res))
    # throughput does not depend on the pixels: random line integrals, the same on every rank
    series = torch.rand(geo.num_tilts, res, res, generator=torch.Generator().manual_seed(0))
    series = series.to(device)

    records, params = {}, None
    cases = {"default step": None, "eager step": False}
    for name, graph in cases.items():
        if device.type != "cuda" and graph is None:
            continue  # the same eager step as the next case off CUDA
        cfg = {**config, "cuda_graph": graph}
        _run(series, geo, cfg, 10 if not args.tiny else 2, device)  # compile, warm up
        short, _ = _run(series, geo, cfg, steps, device)
        long, result = _run(series, geo, cfg, 2 * steps, device)
        per_step = max(long - short, 1e-9) / steps
        records[name] = {"ms_per_step": per_step * 1e3, "steps_per_s": 1.0 / per_step}
        if args.profile:
            runs = [
                profile_step(
                    lambda c=cfg, n=n: _run(series, geo, c, n, device),
                    device=device, calls=1, warmup=0, top=60,
                )
                for n in (steps, 2 * steps)
            ]  # fmt: skip
            records[name]["profile"] = per_step_profile(*runs, steps)
        params = [p.detach() for p in result.object_model.field.parameters()]

    numel = sum(p.numel() for p in params) + 1
    flat = torch.zeros(numel, device=device)
    op = dist.ReduceOp.AVG if backend == "nccl" else dist.ReduceOp.SUM
    for _ in range(5):
        dist.all_reduce(flat, op=op)
    synchronize(device)
    dist.barrier()
    n = 3 if args.tiny else 100
    t0 = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(flat, op=op)
    synchronize(device)
    records["gradient all-reduce alone"] = {
        "ms_per_step": (time.perf_counter() - t0) * 1e3 / n,
        "bytes": numel * flat.element_size(),
    }

    mismatch = torch.zeros((), device=device)
    for p in params:
        mine = p.clone()
        dist.broadcast(mine, src=0)
        mismatch += (mine != p).sum()
    dist.all_reduce(mismatch)
    checks = {"replicas_identical": bool(mismatch.item() == 0)}
    per_rank = [None] * world
    dist.all_gather_object(per_rank, records)

    if rank == 0:
        out = {
            "benchmark": "tomo-kplanes ddp_step",
            "command": " ".join(sys.argv),
            "world_size": world,
            "backend": backend,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "shape": {"resolution": res, "C": channels, "T": rotations, "rays_per_step": rays,
                      "samples_per_ray": samples, "tv_points": tv, "rays_per_rank": -(-rays // world)},
            "timed_steps": steps,
            "records": records,
            "per_rank": per_rank,
            "checks": checks,
        }  # fmt: skip
        try:
            import triton

            out["triton"] = triton.__version__
        except ImportError:
            pass
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)
        print(f"tomo ddp_step: world {world}, {res}^3, {rays} rays x {samples} samples per step")
        for name, r in records.items():
            extra = f"   {r['steps_per_s']:8.1f} steps/s" if "steps_per_s" in r else ""
            print(f"  {name:28s} {r['ms_per_step']:9.4f} ms{extra}")
            for i, rank_records in enumerate(per_rank):
                if "profile" in rank_records[name]:
                    text = format_profile(f"rank {i}", rank_records[name]["profile"])
                    print("    " + text.replace("\n", "\n    "))
        print(f"  checks: {checks}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
