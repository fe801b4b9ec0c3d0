"""Where one MaxSim training step's time goes: wall time per step (host timer, many steps, one
synchronize), ``do_bench`` time, the GPU kernels of a step (``torch.profiler``) and the top of a
cProfile of its Python work.

    python3 tools/gpu/step_profile.py [--out DIR] [--steps 200] [--cases NAME ...]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

import torch
import triton.testing

ROOT = Path(__file__).resolve().parents[2]

# name: (B, K or None for all pairs, Lq, Ld), d = 128, bf16
CASES = {
    "hard-negatives-b128x8": (128, 8, 32, 1030),
    "hard-negatives-b256x16": (256, 16, 32, 1030),
    "rerank-grad-1x1000": (1, None, 32, 300),
    "in-batch-b128-ld1030": (128, None, 32, 1030),
}


def make_step(case, method):
    from late_interaction_kernels import maxsim

    b, k, lq, ld = CASES[case]
    gen = torch.Generator().manual_seed(0)
    nd = 1000 if case.startswith("rerank") else b
    Q = torch.randn(b, lq, 128, generator=gen).to("cuda", torch.bfloat16).requires_grad_()
    shape = (nd, ld, 128) if k is None else (b, k, ld, 128)
    D = torch.randn(shape, generator=gen).to("cuda", torch.bfloat16).requires_grad_()
    grad = torch.randn(b, nd if k is None else k, generator=gen).to("cuda")

    def step():
        Q.grad = D.grad = None
        maxsim(Q, D, backward=method).backward(grad)

    return step


def autograd_floor():
    """The least an eager training step of one custom autograd op costs on this host: one
    ``torch.autograd.Function`` with one elementwise kernel each way (rerank-sized tensors)."""

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    x = torch.randn(1000, 32, device="cuda", requires_grad=True)
    g = torch.randn(1000, 32, device="cuda")

    def step():
        x.grad = None
        Scale.apply(x).backward(g)

    return step


def kernel_table(step, steps: int = 5) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.device_time_total > 0:
            rows.append(
                {"name": e.key[:60], "count": e.count // steps, "us": e.device_time_total / steps}
            )
    return sorted(rows, key=lambda r: -r["us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--methods", nargs="*", default=["auto", "lowmem", "unified"])
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results, listings = [], []
    floor = autograd_floor()
    for _ in range(20):
        floor()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        floor()
    torch.cuda.synchronize()
    floor_ms = (time.perf_counter() - start) / args.steps * 1e3
    results.append({"case": "autograd-floor", "method": "-", "wall_ms": floor_ms})
    print(f"one autograd.Function step (floor): wall {floor_ms:.3f} ms", flush=True)
    for case in args.cases:
        for method in args.methods:
            step = make_step(case, method)
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            gpu_ms = triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median")
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
            wall_ms = (time.perf_counter() - start) / args.steps * 1e3
            kernels = kernel_table(step)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(50):
                step()
            prof.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
            listings.append(f"===== {case} {method}\n{s.getvalue()}")
            row = {
                "case": case, "method": method, "do_bench_ms": gpu_ms, "wall_ms": wall_ms,
                "kernel_us": sum(r["us"] for r in kernels), "kernels": kernels[:12],
            }  # fmt: skip
            results.append(row)
            print(f"{case:26s} {method:8s} do_bench {gpu_ms:.3f} ms  wall {wall_ms:.3f} ms  "
                  f"kernels {row['kernel_us'] / 1e3:.3f} ms", flush=True)  # fmt: skip
            for r in kernels[:8]:
                print(f"    {r['us']:8.1f} us x{r['count']}  {r['name']}")
            del step
            torch.cuda.empty_cache()
    (out / "step_profile.json").write_text(json.dumps(results, indent=1))
    (out / "step_profile.txt").write_text("\n".join(listings))


if __name__ == "__main__":
    # this checkout's packages first; host_profile.py imports this module and picks its own
    for p in [
        ROOT / "shared" / "triton-dispatch" / "src",
        *sorted((ROOT / "packages").glob("*/src")),
    ]:
        sys.path.insert(0, str(p))
    main()
