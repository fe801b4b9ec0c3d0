"""Where the time of host-bound training steps goes, and whether a GPU-bound forward is
GPU-bound: the MaxSim rerank step (1 × 1000 × 32 × 300, bf16) against the floor of one
``autograd.Function``, with the time spent inside the backward's plan and per kernel launch, the
same step with autograd's device threads off; the (32, 32, 1024, 1024) forward's ``do_bench``,
wall and kernel times beside its host time per call; and the ResidualVQ training step
(B = 640, 3 × 256 × 64) split into the user's loss expression, the module's forward and the rest.

    python3 tools/gpu/step_breakdown.py [--out DIR] [--steps 2000] [--parts rerank long rvq]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in [
    ROOT / "shared" / "triton-dispatch" / "src",
    ROOT / "packages" / "late-interaction-kernels" / "src",
    ROOT / "packages" / "vq-kernels" / "src",
]:
    sys.path.insert(0, str(p))

import host_profile  # noqa: E402  (this folder)
import torch  # noqa: E402
import triton.testing  # noqa: E402
from step_profile import autograd_floor  # noqa: E402


def wall_us(fn, steps: int, repeats: int = 3) -> float:
    """Best of ``repeats`` wall times per call over ``steps`` back-to-back calls."""
    return min(host_profile.wall_us(fn, steps) for _ in range(repeats))


def kernel_us(fn, calls: int = 20) -> float:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(e.device_time_total for e in prof.key_averages()) / calls


def _timed(owner, name: str, totals: dict):
    """Wrap ``owner.name`` to add its wall time and call count into ``totals``; returns the
    original."""
    original = getattr(owner, name)

    def timed(*args):
        start = time.perf_counter()
        out = original(*args)
        totals["s"] += time.perf_counter() - start
        totals["n"] += 1
        return out

    setattr(owner, name, timed)
    return original


def rerank_step(steps: int, record) -> None:
    from late_interaction_kernels import maxsim
    from late_interaction_kernels.ops.maxsim import backward_plan
    from triton_dispatch import launch

    gen = torch.Generator().manual_seed(0)
    Q = torch.randn(1, 32, 128, generator=gen).to("cuda", torch.bfloat16).requires_grad_()
    D = torch.randn(1000, 300, 128, generator=gen).to("cuda", torch.bfloat16).requires_grad_()
    grad = torch.randn(1, 1000, generator=gen).to("cuda")
    floor = autograd_floor()

    def step():
        Q.grad = D.grad = None
        maxsim(Q, D).backward(grad)

    record("floor: one autograd.Function step, wall", wall_us(floor, steps))
    record("rerank step, wall", wall_us(step, steps))
    record("rerank step, do_bench", 1e3 * triton.testing.do_bench(step, warmup=25, rep=200))
    for owner, name, label in (
        (backward_plan.BackwardPlan, "__call__", "inside the backward plan, per step"),
        (launch.KernelLaunch, "__call__", "inside one kernel launch"),
    ):
        totals = {"s": 0.0, "n": 0}
        original = _timed(owner, name, totals)
        try:
            wall_us(step, steps, repeats=1)
        finally:
            setattr(owner, name, original)
        record(label, totals["s"] / max(totals["n"], 1) * 1e6)
    torch.autograd.set_multithreading_enabled(False)
    try:
        record("rerank step, autograd multithreading off, wall", wall_us(step, steps))
        record("floor, autograd multithreading off, wall", wall_us(floor, steps))
    finally:
        torch.autograd.set_multithreading_enabled(True)


def long_forward(record) -> None:
    from late_interaction_kernels import maxsim

    Q = torch.randn(32, 1024, 128, device="cuda", dtype=torch.bfloat16)
    D = torch.randn(32, 1024, 128, device="cuda", dtype=torch.bfloat16)

    def op():
        return maxsim(Q, D)

    for i in range(3):
        record(f"(32,32,1024,1024) do_bench [{i}]", 1e3 * triton.testing.do_bench(op, rep=400))
    record("(32,32,1024,1024) wall", wall_us(op, 200, repeats=1))
    record("(32,32,1024,1024) kernels", kernel_us(op))
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # the GPU busy: the loop below times the host alone
    start = time.perf_counter()
    for _ in range(50):
        op()
    record("(32,32,1024,1024) host per call", (time.perf_counter() - start) / 50 * 1e6)
    torch.cuda.synchronize()


def rvq_step(steps: int, record) -> None:
    from vq_kernels import ResidualVQ

    torch.manual_seed(0)
    module = ResidualVQ(64, 256, 3).cuda()
    x = torch.randn(640, 64, device="cuda", requires_grad=True)
    module(x)  # k-means initialisation

    def step():  # what packages/vq-kernels/benchmarks/rvq_step.py times
        out = module(x)
        (out.quantized.square().mean() + out.loss).backward()

    def loss_expression():  # the same user-side ops and their backward, without the module
        (x.square().mean() + x.sum()).backward()

    def forward():
        module(x)

    steps = max(steps // 2, 1)
    record("rvq step, wall", wall_us(step, steps))
    record("rvq step, do_bench", 1e3 * triton.testing.do_bench(step, warmup=25, rep=200))
    record(
        "rvq: the user's loss expression and its backward alone, wall",
        wall_us(loss_expression, steps),
    )
    record("rvq: module forward (training, EMA update), wall", wall_us(forward, steps))
    module.eval()
    with torch.no_grad():
        record("rvq: module forward (eval, no_grad), wall", wall_us(forward, steps))
    module.train()
    torch.autograd.set_multithreading_enabled(False)
    try:
        record("rvq step, autograd multithreading off, wall", wall_us(step, steps))
    finally:
        torch.autograd.set_multithreading_enabled(True)


PARTS = ("rerank", "long", "rvq")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--parts", nargs="*", choices=PARTS, default=list(PARTS))
    args = parser.parse_args()
    results: dict[str, float] = {}

    def record(name: str, us: float) -> None:
        results[name] = us
        print(f"{name:52s} {us:9.1f} us", flush=True)

    if "rerank" in args.parts:
        rerank_step(args.steps, record)
    if "long" in args.parts:
        long_forward(record)
    if "rvq" in args.parts:
        rvq_step(args.steps, record)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "step_breakdown.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
