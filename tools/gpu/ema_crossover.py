"""The crossover between the two single-launch designs of ``ema_update_``: the small-batch kernel
(one program per code, no scratch) and the cooperative scatter + epilogue kernel, both launched
from the op's plan. For each (B, K, D) it forces one design (``SMALL_UPDATE_MAX_WORK``) and
records ``do_bench``, wall time per call and the kernels of one call (``torch.profiler``).

    python3 tools/gpu/ema_crossover.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in [ROOT / "shared" / "triton-dispatch" / "src", ROOT / "packages" / "vq-kernels" / "src"]:
    sys.path.insert(0, str(p))

import torch  # noqa: E402
import triton.testing  # noqa: E402
from step_profile import kernel_table  # noqa: E402  (this folder)

SHAPES = [
    (64, 16, 64),
    (256, 64, 64),
    (640, 256, 64),
    (1024, 1024, 64),
    (2048, 256, 64),
    (4096, 1024, 64),
    (8192, 512, 64),
    (16384, 256, 64),
    (640, 256, 256),
    (4096, 1024, 128),
    (16384, 1024, 64),
    (65536, 256, 64),
]


def measure(batch: int, num_codes: int, dim: int) -> dict:
    from triton_dispatch.bench import wall_ms_per_call
    from vq_kernels import ema_update_

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, dim, generator=gen).cuda()
    codes = torch.randint(0, num_codes, (batch,), generator=gen).cuda()
    codebook = torch.randn(num_codes, dim, generator=gen).cuda()
    state = [
        codebook,
        torch.ones(num_codes, device="cuda"),
        codebook.clone(),
        torch.zeros(num_codes, dtype=torch.int32, device="cuda"),
    ]

    def call():
        ema_update_(x, codes, *state, check_codes=False)

    call()
    call()  # the first call of a plan compiles; the second binds the direct launch
    torch.cuda.synchronize()
    kernels = kernel_table(call)
    return {
        "do_bench_us": triton.testing.do_bench(call, warmup=25, rep=200) * 1e3,
        "wall_us": wall_ms_per_call(call, device="cuda", calls=300) * 1e3,
        "gpu_us": sum(k["us"] for k in kernels),
        "kernels": kernels,
    }


def main() -> None:
    from triton_dispatch.launch import clear_plan_caches
    from vq_kernels.ops.ema_update import kernels

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    args = parser.parse_args()
    rows = []
    for repeat in range(2):
        for design, max_work in (("small-batch", 1 << 62), ("cooperative", 0)):
            kernels.SMALL_UPDATE_MAX_WORK = max_work
            clear_plan_caches()
            for shape in SHAPES:
                row = {"design": design, "shape": shape, "repeat": repeat, **measure(*shape)}
                rows.append(row)
                print(
                    f"{design:12} {shape!s:20} GPU {row['gpu_us']:6.1f} us  do_bench "
                    f"{row['do_bench_us']:6.1f}  wall {row['wall_us']:6.1f}",
                    flush=True,
                )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(Path(args.out) / "ema_crossover.json", "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
