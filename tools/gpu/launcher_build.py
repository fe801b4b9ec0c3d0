"""Triton's C launcher built at -O3 (Triton's own build) against -O1 (``triton_dispatch``'s
``fast_build``): the build time of a fresh launcher, and the host time of one launch through it.

Each build runs in its own process with an empty Triton cache; a launch is timed as the best of
``--repeats`` runs of ``--calls`` back-to-back calls of the compiled kernel's launcher (the
minimum, because launch overhead only gets noise added, never taken away).

    python3 tools/gpu/launcher_build.py [--rounds 3] [--out launcher_build.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child(calls: int, repeats: int) -> dict:
    sys.path.insert(0, str(ROOT / "shared" / "triton-dispatch" / "src"))
    import torch
    import triton
    import triton.language as tl

    from triton_dispatch.host_build import install_fast_host_builds

    fast = install_fast_host_builds()

    @triton.jit
    def copy(X, Y, n, scale, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(Y + i, tl.load(X + i, mask=i < n) * scale, mask=i < n)

    x = torch.randn(4096, device="cuda")
    y = torch.empty_like(x)
    start = time.perf_counter()
    # the first launch: Triton's driver module, the kernel's compile, its launcher, the load
    compiled = copy[(4,)](x, y, 4096, 2.0, BLOCK=1024)
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    stream = torch.cuda.current_stream().cuda_stream
    run, fn, meta = compiled.run, compiled.function, compiled.packed_metadata
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            run(4, 1, 1, stream, fn, meta, None, None, None, x, y, 4096, 2.0, 1024)
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return {"fast_build": fast, "first_call_s": first, "launch_us": best}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path("launcher_build.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.calls, args.repeats)))
        return
    rows = []
    for _ in range(args.rounds):
        for fast in ("0", "1"):
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, TRITON_CACHE_DIR=cache, TRITON_DISPATCH_FAST_HOST_BUILD=fast)
                env.pop("TRITON_INTERPRET", None)
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", "--calls", str(args.calls),
                     "--repeats", str(args.repeats)],
                    env=env, capture_output=True, text=True, timeout=300,
                )  # fmt: skip
                line = [x for x in proc.stdout.splitlines() if x.startswith("{")]
                rows.append(json.loads(line[-1]) if line else {"error": proc.stderr[-2000:]})
    args.out.write_text(json.dumps(rows, indent=1))
    for label, fast in (("-O3 (Triton)", False), ("-O1 (fast_build)", True)):
        mine = [r for r in rows if r.get("fast_build") == fast]
        if mine:
            launch = sorted(r["launch_us"] for r in mine)
            first = sorted(r["first_call_s"] for r in mine)
            print(f"{label}: launch µs {launch}, first call s {[round(f, 3) for f in first]}")


if __name__ == "__main__":
    main()
