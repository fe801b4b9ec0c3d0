"""Where the host time of one op call goes: wall time per call (many back-to-back calls, one
synchronize), ``do_bench`` GPU time, the kernels of a call (``torch.profiler``), the floor of a
bare Triton launch, and a cProfile of the Python work behind the small shapes users call per
training step.

    python3 tools/gpu/host_profile.py [--out DIR] [--calls 2000]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# --root DIR profiles another checkout's packages (a baseline beside this one, same process kind)
_root = Path(sys.argv[sys.argv.index("--root") + 1]) if "--root" in sys.argv else ROOT
for p in [
    _root / "shared" / "triton-dispatch" / "src",
    *sorted((_root / "packages").glob("*/src")),
]:
    sys.path.insert(0, str(p))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.testing  # noqa: E402
from step_profile import kernel_table  # noqa: E402  (this folder)


@triton.jit
def _copy(X, Y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i, mask=i < n), mask=i < n)


def wall_us(fn, calls: int, blocks: int = 10) -> float:
    """Best of ``blocks`` timings of ``calls / blocks`` back-to-back calls (one synchronize each),
    the garbage collector paused: a shared host's interruptions land in some blocks, not all."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    per_block = max(calls // blocks, 1)
    best = float("inf")
    gc.collect()
    gc.disable()
    try:
        for _ in range(blocks):
            start = time.perf_counter()
            for _ in range(per_block):
                fn()
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - start) / per_block * 1e6)
    finally:
        gc.enable()
    return best


def profile_text(fn, calls: int, top: int = 30) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def cases():
    from late_interaction_kernels import maxsim
    from vq_kernels import ema_update_, quantize

    dev = "cuda"
    out = {}
    x = torch.randn(4096, device=dev)
    y = torch.empty_like(x)
    out["triton launch (jit [grid])"] = lambda: _copy[(4,)](x, y, 4096, BLOCK=1024)
    compiled = _copy[(4,)](x, y, 4096, BLOCK=1024)
    stream = torch.cuda.current_stream().cuda_stream
    out["triton launch (compiled.run)"] = lambda: compiled.run(
        4, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None,
        x, y, 4096, 1024,
    )  # fmt: skip
    out["torch.empty"] = lambda: torch.empty(256, device=dev)
    out["torch.zeros"] = lambda: torch.zeros(256, device=dev)
    out["torch.randint"] = lambda: torch.randint(0, 640, (256,), device=dev)
    for nq, nd, lq, ld in [(1, 100, 32, 300), (1, 1000, 32, 300), (32, 32, 32, 300)]:
        Q = torch.randn(nq, lq, 128, device=dev, dtype=torch.bfloat16)
        D = torch.randn(nd, ld, 128, device=dev, dtype=torch.bfloat16)
        out[f"maxsim {(nq, nd, lq, ld)}"] = lambda Q=Q, D=D: maxsim(Q, D)
    for b, k, d in [(640, 256, 64), (4096, 1024, 64)]:
        xs = torch.randn(b, d, device=dev)
        codes = torch.randint(0, k, (b,), device=dev)
        cb = torch.randn(k, d, device=dev)
        state = [
            cb,
            torch.ones(k, device=dev),
            cb.clone(),
            torch.zeros(k, dtype=torch.int32, device=dev),
        ]
        out[f"ema_update_ {(b, k, d)}"] = lambda xs=xs, codes=codes, state=state: ema_update_(
            xs, codes, *state, check_codes=False
        )
        out[f"quantize {(b, k, d)}"] = lambda xs=xs, cb=cb: quantize(xs, cb)
    # calls that will be differentiated: the route through an autograd node
    Qg = torch.randn(32, 32, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
    D = torch.randn(32, 300, 128, device=dev, dtype=torch.bfloat16)
    out["maxsim (32, 32, 32, 300) fwd+bwd"] = lambda: maxsim(Qg, D).sum().backward()
    from tomo_kplanes import tilted_plane_features

    pts = torch.rand(1024, 3, device=dev) * 2 - 1
    rot = torch.eye(3, device=dev).repeat(2, 1, 1).requires_grad_()
    planes = torch.randn(6, 8, 48, 48, device=dev, requires_grad=True)
    out["tilted_plane_features (1024 pts, T 2) fwd+bwd"] = lambda: (
        tilted_plane_features(pts, rot, planes).sum().backward()
    )
    xg = torch.randn(640, 64, device=dev, requires_grad=True)
    cbg = torch.randn(256, 64, device=dev, requires_grad=True)
    out["quantize (640, 256, 64) fwd+bwd"] = lambda: quantize(xg, cbg)[1].sum().backward()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--root", default=str(ROOT), help="checkout whose packages are profiled")
    parser.add_argument("--profile", action="store_true", help="also write cProfile listings")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, listings = [], []
    import triton_dispatch

    source = Path(triton_dispatch.__file__).resolve()
    if not source.is_relative_to(Path(args.root).resolve()):
        raise SystemExit(f"--root {args.root}: triton_dispatch came from {source} instead")
    for name, fn in cases().items():
        fn()
        torch.cuda.synchronize()
        gpu_ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        kernels = kernel_table(fn)
        rows.append(
            {
                "case": name,
                "wall_us": wall_us(fn, args.calls),
                "do_bench_us": gpu_ms * 1e3,
                "kernel_us": sum(k["us"] for k in kernels),
                "kernels": kernels,
            }
        )
        if args.profile and not name.startswith(("torch.", "triton launch")):
            listings.append(f"===== {name}\n{profile_text(fn, 500)}")
    (out / "host_profile.json").write_text(json.dumps(rows, indent=1))
    if listings:
        (out / "host_profile.txt").write_text("\n".join(listings))
    print(f"{'case':40s} {'wall µs':>9s} {'do_bench µs':>12s} {'kernels µs':>11s}")
    for r in rows:
        print(
            f"{r['case']:40s} {r['wall_us']:9.1f} {r['do_bench_us']:12.1f} {r['kernel_us']:11.1f}"
        )
        if r["case"].startswith(("ema_update_", "quantize")):
            for k in r["kernels"]:
                print(f"    {k['us']:8.1f} us x{k['count']}  {k['name']}")


if __name__ == "__main__":
    main()
