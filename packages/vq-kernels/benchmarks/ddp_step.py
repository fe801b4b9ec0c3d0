"""A residual-VQ training step under data parallelism: 3 levels x 1024 codes x 64 dims, 65,536 rows
per rank (weak scaling: each rank its own rows, EMA statistics summed over the group). Launch once
with one process and once with two, and compare the step times:

    python3 -m torch.distributed.run --nproc_per_node=1 packages/vq-kernels/benchmarks/ddp_step.py --out vq1.json
    python3 -m torch.distributed.run --nproc_per_node=2 packages/vq-kernels/benchmarks/ddp_step.py --out vq2.json

The step is what a user runs: the module's forward (search, losses, EMA update of every level)
on bf16 encoder output, then the loss's backward. One process runs it without a process group
(the single-GPU step); several pass the group. Records, per rank (``triton_dispatch.bench.
collective_ms``: the same call count on every rank): GPU time per step (median of per-call CUDA
events), GPU time per step of a back-to-back loop, wall time per step, the statistics all-reduce
alone, and checks that the ranks hold identical state and equal one process on the concatenated
batch (gathered to rank 0). On CUDA the step is also timed replayed as one CUDA graph
(``triton_dispatch.graphs.CapturedStep``, the collective inside the graph). ``--profile``: where each rank's step time goes (collective, compute,
idle; ``profile_step``). ``--tiny``: small shapes on CPU (gloo).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

from triton_dispatch.bench import collective_ms, format_profile, profile_step, synchronize
from triton_dispatch.graphs import CapturedStep
from vq_kernels import ResidualVQ


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file written by rank 0")
    p.add_argument("--rows", type=int, default=65536, help="rows per rank")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--steps", type=int, default=200, help="timed steps")
    p.add_argument("--tiny", action="store_true", help="small shapes on the CPU (gloo)")
    p.add_argument("--profile", action="store_true", help="where each step's time goes")
    return p.parse_args()


def _time(fn, steps: int, device: torch.device, profile: bool) -> dict:
    """GPU and wall ms per step over the same call count on every rank (and where the time goes,
    with ``--profile``)."""
    out = collective_ms(fn, device=device, calls=steps, warmup=max(steps // 10, 3))
    if profile:
        out["profile"] = profile_step(fn, device=device, calls=20, python_top=12)
    return out


def _module(dim, codes, levels, group, device):
    torch.manual_seed(0)
    return ResidualVQ(dim, codes, levels, process_group=group).to(device)


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
    levels, codes, dim = (2, 16, 8) if args.tiny else (3, 1024, 64)
    rows = 48 if args.tiny else args.rows
    steps = 3 if args.tiny else args.steps
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    if device.type == "cpu" and dtype != torch.float32:
        dtype = torch.float32  # the interpreter's bf16 dot is wrong (NOTES.md); CPU runs fp32
    group = dist.group.WORLD if world > 1 else None

    # each rank's rows; rank r's are the r-th block of one global batch
    g = torch.Generator().manual_seed(0)
    full = torch.randn(world * rows, dim, generator=g)
    x = full[rank * rows : (rank + 1) * rows].to(device, dtype).requires_grad_()
    vq = _module(dim, codes, levels, group, device)

    def step(module=vq):
        out = module(x)
        loss = out.quantized.float().square().mean() + out.loss
        loss.backward()
        return loss

    records = {}
    records["step"] = _time(step, steps, device, args.profile)
    if device.type == "cuda":
        # the same step replayed as one CUDA graph (collective included): no host time per step
        graphed_vq = _module(dim, codes, levels, group, device)
        graphed = CapturedStep(lambda: step(graphed_vq))
        records["step, CUDA graph"] = _time(graphed, steps, device, args.profile)
        # a live graph holding NCCL kernels keeps the communicator from being torn down
        del graphed, graphed_vq
        torch.cuda.synchronize(device)
    if world == 1:
        # the group path with nobody to talk to: what the kernels alone cost on that path
        grouped = _module(dim, codes, levels, dist.group.WORLD, device)
        records["step, group of one"] = _time(lambda: step(grouped), steps, device, args.profile)
    flat = torch.zeros(levels * codes * (2 * dim + 1), device=device)
    records["statistics all-reduce alone"] = _time(
        lambda: dist.all_reduce(flat), steps, device, False
    )
    records["statistics all-reduce alone"]["bytes"] = flat.numel() * flat.element_size()

    per_rank = [None] * world
    dist.all_gather_object(per_rank, records)
    checks = _checks(full, rows, levels, codes, dim, group, device, dtype, rank, world)
    if rank == 0:
        result = {
            "benchmark": "vq-kernels ddp_step",
            "command": " ".join(sys.argv),
            "world_size": world,
            "backend": backend,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "shape": {"rows_per_rank": rows, "L": levels, "K": codes, "D": dim},
            "dtype": str(dtype),
            "steps": steps,
            "records": records,
            "per_rank": per_rank,
            "checks": checks,
        }
        try:
            import triton

            result["triton"] = triton.__version__
        except ImportError:
            pass
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(
            f"vq ddp_step: world {world}, {rows} rows/rank, L={levels} K={codes} D={dim}, {dtype}"
        )
        for name in records:
            # the slowest rank's figures are the step's
            r = max((rank_records[name] for rank_records in per_rank), key=lambda x: x["gpu_ms"])
            print(
                f"  {name:32s} gpu {r['gpu_ms']:8.4f} ms   loop {r['loop_gpu_ms']:8.4f} ms   "
                f"wall {r['wall_ms']:8.4f} ms"
            )
            for i, rank_records in enumerate(per_rank):
                if "profile" in rank_records[name]:
                    text = format_profile(f"rank {i}", rank_records[name]["profile"])
                    print("    " + text.replace("\n", "\n    "))
        print(f"  checks: {checks}")
    dist.destroy_process_group()


def _checks(full, rows, levels, codes, dim, group, device, dtype, rank, world) -> dict:
    """Three steps from the same start: ranks identical; rank 0 against one process on the
    concatenated batch (no restarts, so the restart rows, drawn from rank 0's rows alone, do
    not enter the comparison)."""
    x = full[rank * rows : (rank + 1) * rows].to(device, dtype)
    vq = ResidualVQ(dim, codes, levels, dead_threshold=None, process_group=group).to(device)
    torch.manual_seed(1)
    vq.load_state_dict(ResidualVQ(dim, codes, levels).state_dict())
    for _ in range(3):
        vq(x)
    synchronize(device)
    state = [t.detach() for t in vq.state_dict().values()]
    mismatch = torch.zeros((), device=device)
    for t in state:
        mine = t.clone()
        dist.broadcast(mine, src=0)
        mismatch += (mine != t).sum()
    dist.all_reduce(mismatch)
    out = {"ranks_identical": bool(mismatch.item() == 0)}
    if rank == 0:
        single = ResidualVQ(dim, codes, levels, dead_threshold=None).to(device)
        torch.manual_seed(1)
        single.load_state_dict(ResidualVQ(dim, codes, levels).state_dict())
        everything = full.to(device, dtype)
        for _ in range(3):
            single(everything)
        diffs = [
            (a.double() - b.double()).abs().max().item()
            for a, b in zip(vq.state_dict().values(), single.state_dict().values())
            if a.is_floating_point()
        ]
        out["max_abs_diff_vs_one_process"] = max(diffs)
        out["equal_to_one_process"] = max(diffs) <= 1e-3
    return out


if __name__ == "__main__":
    main()
