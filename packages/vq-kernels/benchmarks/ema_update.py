"""Time the fused EMA codebook update against the plain-PyTorch updates a user would write.

python3 packages/vq-kernels/benchmarks/ema_update.py --out ema.json [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _baselines import ema_step, index_add_statistics, onehot_statistics

from triton_dispatch.bench import (
    BenchRecord,
    benchmark_arguments,
    compare,
    environment,
    median_ms,
    report,
    wall_ms_per_call,
)
from triton_dispatch.launch import clear_plan_caches
from vq_kernels import ema_update_
from vq_kernels.ops.ema_update import kernels

SHAPES = [
    (640, 256, 64),
    (4096, 256, 64),
    (4096, 1024, 64),
    (16384, 1024, 64),
    (65536, 256, 64),
    (65536, 4096, 128),
]


def state(num_codes, dim, device):
    g = torch.Generator(device="cpu").manual_seed(1)
    codebook = torch.randn(num_codes, dim, generator=g).to(device)
    return [
        codebook,
        torch.ones(num_codes, device=device),
        codebook.clone(),
        torch.zeros(num_codes, dtype=torch.int32, device=device),
    ]


def timed_with(fn, max_work, device):
    """(do_bench ms, wall ms per call) of ``fn`` with the small-batch kernel's size limit set to
    ``max_work`` (plans rebuilt once, then reused)."""
    saved = kernels.SMALL_UPDATE_MAX_WORK
    kernels.SMALL_UPDATE_MAX_WORK = max_work
    clear_plan_caches()
    try:
        return median_ms(fn, device=device), wall_ms_per_call(fn, device=device)
    finally:
        kernels.SMALL_UPDATE_MAX_WORK = saved
        clear_plan_caches()


def main() -> None:
    args = benchmark_arguments(__doc__).parse_args()
    device = torch.device(args.device)
    shapes = SHAPES[:2] if args.quick else SHAPES
    records = []
    compiled_onehot = torch.compile(lambda *a: ema_step(onehot_statistics, *a))
    for batch, num_codes, dim in shapes:
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(batch, dim, generator=g).to(device)
        codes = torch.randint(0, num_codes, (batch,), generator=g).to(device)
        shape = {"B": batch, "K": num_codes, "D": dim}
        ours_state, base_state = state(num_codes, dim, device), state(num_codes, dim, device)
        read_x_ms = median_ms(lambda: x.sum(), device=device)

        def ours(det=False):
            ema_update_(x, codes, *ours_state, check_codes=False, deterministic=det)

        baselines = {
            "eager one-hot": lambda: ema_step(onehot_statistics, x, codes, *base_state),
            "eager index_add_": lambda: ema_step(index_add_statistics, x, codes, *base_state),
            "compiled one-hot": lambda: compiled_onehot(x, codes, *base_state),
        }
        for name, fn in baselines.items():
            rec = compare(
                "ema_update",
                shape,
                ours=ours,
                baseline=fn,
                baseline_name=name,
                device=device,
                extra={"read_x_ms": read_x_ms},
            )
            if rec.ours_ms:
                rec.extra["ours_over_read_x"] = rec.ours_ms / read_x_ms
            records.append(rec)
        if dim <= kernels.SMALL_UPDATE_MAX_DIM:
            # the crossover between the two single-launch designs (SMALL_UPDATE_MAX_WORK)
            small_ms, small_wall = timed_with(ours, 1 << 62, device)
            coop_ms, coop_wall = timed_with(ours, 0, device)
            records.append(
                BenchRecord(
                    "ema_update small-batch kernel", shape, "ours (cooperative scatter)", coop_ms,
                    small_ms, baseline_wall_ms=coop_wall, ours_wall_ms=small_wall,
                    env=environment(device),
                )
            )
        rec = compare(
            "ema_update deterministic",
            shape,
            ours=lambda: ours(True),
            baseline=ours,
            baseline_name="ours (atomic)",
            device=device,
            extra={"read_x_ms": read_x_ms},
        )
        records.append(rec)
    report(records, args.out, meta={"command": " ".join(sys.argv)})


if __name__ == "__main__":
    main()
