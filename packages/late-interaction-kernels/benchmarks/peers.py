"""MaxSim forward against the published peers, each in its own process (the published
late-interaction-kernels has our import name), in one run: ``do_bench`` median GPU time and wall
time per call (host timer over back-to-back calls, one synchronize).

    python3 packages/late-interaction-kernels/benchmarks/peers.py --peers DIR --out peers.json

``DIR`` holds one folder per peer, each a ``pip install --no-deps --target`` of its wheel:
``lik`` (late-interaction-kernels 0.4.5) and ``flash-maxsim`` (flash-maxsim 0.3.0). A peer whose
folder is missing is skipped. Ours runs from this source tree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# (Nq, Nd, Lq, Ld), d = 128, bf16: the shapes a training or serving step calls per step.
SHAPES = [
    (1, 100, 32, 300),
    (1, 1000, 32, 300),
    (32, 32, 32, 300),
    (1, 1000, 32, 1024),
    (128, 128, 32, 300),
    (1, 1000, 128, 1024),
]
DIM = 128
PEERS = {"lik": "late-interaction-kernels 0.4.5", "flash-maxsim": "flash-maxsim 0.3.0"}


def _function(impl: str):
    if impl in ("ours", "lik"):
        from late_interaction_kernels import maxsim

        return lambda Q, D: maxsim(Q, D)
    from flash_maxsim import flash_maxsim, flash_maxsim_batched

    def call(Q, D):
        if Q.shape[0] == 1:
            return flash_maxsim(Q[0], D)
        return flash_maxsim_batched(Q, D)

    return call


def worker(impl: str, calls: int) -> None:
    import torch
    import triton.testing

    fn = _function(impl)
    rows = []
    for nq, nd, lq, ld in SHAPES:
        gen = torch.Generator(device="cpu").manual_seed(0)
        Q = torch.randn(nq, lq, DIM, generator=gen).to("cuda", torch.bfloat16)
        D = torch.randn(nd, ld, DIM, generator=gen).to("cuda", torch.bfloat16)
        try:
            ref = fn(Q, D)
            torch.cuda.synchronize()
            gpu_ms = triton.testing.do_bench(lambda: fn(Q, D), warmup=50, rep=200, return_mode="median")
            for _ in range(20):
                fn(Q, D)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn(Q, D)
            torch.cuda.synchronize()
            wall_ms = (time.perf_counter() - start) / calls * 1e3
            checksum = float(ref.float().sum())
            rows.append(dict(shape=[nq, nd, lq, ld], gpu_ms=gpu_ms, wall_ms=wall_ms, sum=checksum))
        except Exception as exc:  # a peer without this layout
            rows.append(dict(shape=[nq, nd, lq, ld], error=f"{type(exc).__name__}: {exc}"[:200]))
    print("RESULT " + json.dumps(rows))


def _run(impl: str, path: str, calls: int) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, __file__, "--worker", impl, "--calls", str(calls)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(proc.stdout[-2000:], proc.stderr[-3000:], file=sys.stderr)
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=Path, default=Path(".peers"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.calls)
        return
    root = Path(__file__).resolve().parents[3]
    ours_path = os.pathsep.join(
        [str(root / "shared" / "triton-dispatch" / "src"), str(root / "packages" / "late-interaction-kernels" / "src")]
    )
    results = {"ours": _run("ours", ours_path, args.calls)}
    for impl in PEERS:
        folder = args.peers / impl
        if folder.is_dir():
            results[impl] = _run(impl, str(folder.resolve()), args.calls)
    import torch
    import triton

    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(sys.argv),
        "peers": PEERS,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    header = f"{'shape (Nq,Nd,Lq,Ld)':22s}" + "".join(f"{k + ' gpu/wall ms':>30s}" for k in results)
    print(header)
    for i, shape in enumerate(SHAPES):
        cells = []
        for rows in results.values():
            r = rows[i] if i < len(rows) else {}
            cells.append(
                f"{r['gpu_ms']:.4f} / {r['wall_ms']:.4f}" if "gpu_ms" in r else r.get("error", "-")[:28]
            )
        print(f"{shape!s:22s}" + "".join(f"{c:>30s}" for c in cells))


if __name__ == "__main__":
    main()
