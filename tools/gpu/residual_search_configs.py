"""Every config of the fused residual search against each other: kernel time (one-call CUDA graph
under do_bench's L2 flush, median) and the compile time of each config in an empty Triton cache.

    python3 tools/gpu/residual_search_configs.py --out residual_search_configs.json

The first ResidualVQ step compiles the search on its own thread; this says what a config that
compiles quicker would cost in kernel time at the benchmark's and the tuning shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch
import triton
from triton import knobs

from triton_dispatch import bench, shape_bucket
from vq_kernels.ops.residual_quantize.kernels import residual_quantize_kernel


def arguments(batch: int, codes: int, dim: int, levels: int, dtype: torch.dtype) -> tuple:
    dev = "cuda"
    x = torch.randn(batch, dim, device=dev, dtype=dtype)
    cb = torch.randn(levels, codes, dim, device=dev, dtype=dtype)
    norms = cb.float().norm(dim=-1)
    programs = triton.cdiv(batch, 64)
    out = torch.empty_like(x)
    out_codes = torch.empty(batch, levels, device=dev, dtype=torch.int64)
    level_codes = torch.empty(levels, batch, device=dev, dtype=torch.int64)
    res = torch.empty(levels + 1, batch, dim, device=dev, dtype=dtype)
    partial = torch.empty(programs, device=dev, dtype=torch.float32)
    fp32 = dtype == torch.float32
    meta = dict(
        COSINE=False, UPCAST=fp32, PRECISION="tf32x3" if fp32 else "ieee",
        K_BUCKET=shape_bucket(codes, minimum=32, maximum=1 << 16),
        D_BUCKET=shape_bucket(dim, minimum=16, maximum=1024), BLOCK_B=64, BLOCK_D=32,
    )  # fmt: skip
    args = (x, cb, norms, out, out_codes, level_codes, res, partial, batch, codes, dim, levels, 1.0)
    return args, meta, (programs,)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="residual_search_configs.json")
    parser.add_argument("--shapes", default="640x256x64x3,4096x256x64x3,65536x256x64x3,"
                        "65536x1024x64x3,65536x1024x128x8")  # fmt: skip
    args = parser.parse_args()
    os.environ[bench.GRAPHS_ENV_VAR] = "1"  # kernel time, without the host's launch
    fn = residual_quantize_kernel.base_jit
    configs = [(bk, st) for bk in (32, 64, 128) for st in (2, 3)]
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        compile_s: dict = {}
        for shape in args.shapes.split(","):
            b, k, d, lv = (int(v) for v in shape.split("x"))
            call, meta, grid = arguments(b, k, d, lv, dtype)
            times = {}
            for bk, st in configs:
                opts = dict(meta, BLOCK_K=bk, num_warps=4, num_stages=st)
                key = (bk, st)
                # codebook size and dimension are runtime sizes: one compile per config and dtype
                if key not in compile_s:
                    with tempfile.TemporaryDirectory() as cache:
                        old, knobs.cache.dir = knobs.cache.dir, cache
                        try:
                            t = time.perf_counter()
                            fn.run(*call, grid=grid, warmup=True, **opts)
                            compile_s[key] = time.perf_counter() - t
                        finally:
                            knobs.cache.dir = old

                def launch(opts=opts, call=call, grid=grid):
                    fn[grid](*call, **opts)

                launch()
                times[f"BLOCK_K={bk},stages={st}"] = bench.median_ms(launch, device="cuda")
            best = min(times.values())
            for (bk, st), (name, ms) in zip(configs, times.items()):
                row = dict(shape=shape, dtype=str(dtype), config=name, ms=round(ms, 5),
                           ratio=round(ms / best, 4),
                           compile_s=round(compile_s[(bk, st)], 3))  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "triton": triton.__version__, "date": time.strftime("%Y-%m-%d")}  # fmt: skip
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "meta": meta}, f, indent=1)


if __name__ == "__main__":
    main()
