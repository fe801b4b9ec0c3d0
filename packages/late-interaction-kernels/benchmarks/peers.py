"""MaxSim forward, or forward + backward (``--train``), against the published peers, each in its
own process (the published late-interaction-kernels has our import name), in one run: ``do_bench``
median GPU time and wall time per call (host timer over back-to-back calls, one synchronize).

    python3 packages/late-interaction-kernels/benchmarks/peers.py --peers DIR --out peers.json
    python3 packages/late-interaction-kernels/benchmarks/peers.py --train --peers DIR --out train.json
    python3 packages/late-interaction-kernels/benchmarks/peers.py --mode fp8 --peers DIR --out fp8.json
    python3 packages/late-interaction-kernels/benchmarks/peers.py --mode topk --peers DIR --out topk.json

``--mode fp8`` times ``fp8.maxsim_inference_fp8`` (inputs quantised once by each package's own
``quantize_fp8_per_tensor`` / ``_per_token``) beside that package's bf16 ``maxsim``; ``--mode
topk`` times ``topk.maxsim_topk`` (k = 100) beside ``maxsim`` + ``torch.topk``. Both packages
expose these under the same names, so one worker serves both; flash-maxsim is left out there.

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
    (1, 10000, 32, 300),
    (32, 32, 32, 300),
    (1, 1000, 32, 1024),
    (128, 128, 32, 300),
    (1, 1000, 128, 1024),
    (1, 1000, 1024, 1024),
    (32, 32, 1024, 1024),
]
DIM = 128
# --train: (name, B, K or None for all pairs against Nd documents, Nd, Lq, Ld), bf16; one step is
# ``Q.grad = D.grad = None; maxsim(Q, D, backward=m).backward(g)``. Each backward method of a
# package that has them is timed (the published package's too); flash-maxsim is forward-only here.
TRAIN_SHAPES = [
    ("hard-negatives-b128x8", 128, 8, None, 32, 1030),
    ("hard-negatives-b256x16", 256, 16, None, 32, 1030),
    ("rerank-grad-1x1000", 1, None, 1000, 32, 300),
    ("pylate-in-batch-b256", 256, None, 256, 32, 300),
    ("colpali-in-batch-b128", 128, None, 128, 32, 1030),
]
TRAIN_METHODS = ("auto", "lowmem", "unified")
# --mode fp8: (name, Nq, Nd, Lq, Ld); --mode topk: (name, Nq, Nd, Lq, Ld), k = TOPK
FP8_SHAPES = [("corpus", 1, 10000, 32, 300), ("colpali-rerank", 1, 1000, 128, 1024)]
TOPK_SHAPES = [("1-query-100k", 1, 100000, 32, 300), ("16-queries-20k", 16, 20000, 32, 300)]
TOPK = 100
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


def _time(fn, calls: int) -> tuple[float, float]:
    """``(do_bench median ms, wall ms per call)``. Inline rather than ``triton_dispatch.bench``:
    a peer's process has only the peer on its path."""
    import torch
    import triton.testing

    fn()
    torch.cuda.synchronize()
    gpu_ms = triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return gpu_ms, (time.perf_counter() - start) / calls * 1e3


def train_worker(impl: str, calls: int) -> None:
    import torch

    from late_interaction_kernels import maxsim

    rows = []
    for name, b, k, nd, lq, ld in TRAIN_SHAPES:
        gen = torch.Generator(device="cpu").manual_seed(0)
        Q = torch.randn(b, lq, DIM, generator=gen).to("cuda", torch.bfloat16).requires_grad_()
        shape = (nd, ld, DIM) if k is None else (b, k, ld, DIM)
        D = torch.randn(shape, generator=gen).to("cuda", torch.bfloat16).requires_grad_()
        g = torch.randn(b, nd if k is None else k, generator=gen).to("cuda")
        for method in TRAIN_METHODS:

            def step(m=method, Q=Q, D=D, g=g):
                Q.grad = D.grad = None
                maxsim(Q, D, backward=m).backward(g)

            try:
                gpu_ms, wall_ms = _time(step, max(calls // 10, 50))
                torch.cuda.reset_peak_memory_stats()
                step()
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() / 2**20
                rows.append(dict(case=name, method=method, gpu_ms=gpu_ms, wall_ms=wall_ms, peak_mib=peak,
                                 grad_sum=float(D.grad.float().sum())))  # fmt: skip
            except Exception as exc:
                rows.append(
                    dict(case=name, method=method, error=f"{type(exc).__name__}: {exc}"[:200])
                )
        del Q, D, g
        torch.cuda.empty_cache()
    if impl == "ours":
        rows.append(dict(tuned=_tuned_configs()))
    print("RESULT " + json.dumps(rows))


def _unit(shape, gen):
    import torch

    x = torch.randn(*shape, generator=gen, device="cuda", dtype=torch.bfloat16)
    return torch.nn.functional.normalize(x, dim=-1)


def fp8_worker(impl: str, calls: int) -> None:
    import torch

    from late_interaction_kernels import maxsim
    from late_interaction_kernels.fp8 import (
        maxsim_inference_fp8,
        quantize_fp8_per_tensor,
        quantize_fp8_per_token,
    )

    rows = []
    for name, nq, nd, lq, ld in FP8_SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        Q, D = _unit((nq, lq, DIM), gen), _unit((nd, ld, DIM), gen)
        bf16_ms, bf16_wall = _time(lambda Q=Q, D=D: maxsim(Q, D), calls)
        for scales, quantize in (
            ("per-tensor", quantize_fp8_per_tensor),
            ("per-token", quantize_fp8_per_token),
        ):
            try:
                (q8, sq), (d8, sd) = quantize(Q), quantize(D)
                fn = lambda q8=q8, d8=d8, sq=sq, sd=sd: maxsim_inference_fp8(
                    q8, d8, scale_Q=sq, scale_D=sd
                )
                gpu_ms, wall_ms = _time(fn, calls)
                rows.append(dict(case=name, scales=scales, gpu_ms=gpu_ms, wall_ms=wall_ms,
                                 bf16_ms=bf16_ms, bf16_wall_ms=bf16_wall, sum=float(fn().sum())))  # fmt: skip
            except Exception as exc:
                rows.append(
                    dict(case=name, scales=scales, error=f"{type(exc).__name__}: {exc}"[:200])
                )
        del Q, D
        torch.cuda.empty_cache()
    print("RESULT " + json.dumps(rows))


def topk_worker(impl: str, calls: int) -> None:
    import torch

    from late_interaction_kernels import maxsim
    from late_interaction_kernels.topk import maxsim_topk

    rows = []
    for name, nq, nd, lq, ld in TOPK_SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        Q, D = _unit((nq, lq, DIM), gen), _unit((nd, ld, DIM), gen)
        try:
            base_ms, base_wall = _time(lambda Q=Q, D=D: maxsim(Q, D).topk(TOPK, dim=1), 20)
            fn = lambda Q=Q, D=D: maxsim_topk(Q, D, TOPK)
            gpu_ms, wall_ms = _time(fn, 20)
            torch.cuda.reset_peak_memory_stats()
            fn()
            torch.cuda.synchronize()
            extra = torch.cuda.max_memory_allocated() - Q.nbytes - D.nbytes
            rows.append(dict(case=name, gpu_ms=gpu_ms, wall_ms=wall_ms, baseline_ms=base_ms,
                             baseline_wall_ms=base_wall, extra_mib=extra / 2**20))  # fmt: skip
        except Exception as exc:
            rows.append(dict(case=name, error=f"{type(exc).__name__}: {exc}"[:200]))
        del Q, D
        torch.cuda.empty_cache()
    print("RESULT " + json.dumps(rows))


def worker(impl: str, calls: int) -> None:
    import torch

    fn = _function(impl)
    rows = []
    for nq, nd, lq, ld in SHAPES:
        gen = torch.Generator(device="cpu").manual_seed(0)
        Q = torch.randn(nq, lq, DIM, generator=gen).to("cuda", torch.bfloat16)
        D = torch.randn(nd, ld, DIM, generator=gen).to("cuda", torch.bfloat16)
        try:
            ref = fn(Q, D)
            gpu_ms, wall_ms = _time(lambda Q=Q, D=D: fn(Q, D), calls)
            checksum = float(ref.float().sum())
            rows.append(dict(shape=[nq, nd, lq, ld], gpu_ms=gpu_ms, wall_ms=wall_ms, sum=checksum))
        except Exception as exc:  # a peer without this layout
            rows.append(dict(shape=[nq, nd, lq, ld], error=f"{type(exc).__name__}: {exc}"[:200]))
    if impl == "ours":
        rows.append(dict(tuned=_tuned_configs()))
    print("RESULT " + json.dumps(rows))


def _tuned_configs() -> dict[str, str]:
    """Our forward kernels' autotuned config per key, so a figure can be traced to its tiles."""
    from late_interaction_kernels.ops.maxsim import forward

    out = {}
    for kernel in (forward.maxsim_fwd_kernel, forward.maxsim_fwd_query_group_kernel):
        for key, config in getattr(kernel, "cache", {}).items():
            out[f"{kernel.fn.__name__}{key}"] = str(config)
    return out


def _run(impl: str, path: str, calls: int, mode: str = "forward") -> list[dict]:
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, __file__, "--worker", impl, "--calls", str(calls), "--mode", mode]
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
    parser.add_argument("--mode", choices=list(WORKERS), default="forward")
    parser.add_argument("--train", action="store_true", help="forward + backward (--mode train)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    mode = "train" if args.train else args.mode
    if args.worker:
        WORKERS[mode](args.worker, args.calls)
        return
    root = Path(__file__).resolve().parents[3]
    ours_path = os.pathsep.join(
        [
            str(root / "shared" / "triton-dispatch" / "src"),
            str(root / "packages" / "late-interaction-kernels" / "src"),
        ]
    )
    results = {"ours": _run("ours", ours_path, args.calls, mode)}
    for impl in PEERS:
        folder = args.peers / impl
        if folder.is_dir() and (mode == "forward" or impl == "lik"):
            results[impl] = _run(impl, str(folder.resolve()), args.calls, mode)
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
    for row in results["ours"]:
        for key, config in row.get("tuned", {}).items():
            print(f"tuned {key}: {config}")
    if mode == "train":
        print_train_table(results)
        return
    if mode in ("fp8", "topk"):
        for impl, rows in results.items():
            for r in rows:
                print(
                    impl,
                    json.dumps(
                        {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
                    ),
                )
        return
    header = f"{'shape (Nq,Nd,Lq,Ld)':22s}" + "".join(f"{k + ' gpu/wall ms':>30s}" for k in results)
    print(header)
    for i, shape in enumerate(SHAPES):
        cells = []
        for rows in results.values():
            r = rows[i] if i < len(rows) else {}
            cells.append(
                f"{r['gpu_ms']:.4f} / {r['wall_ms']:.4f}"
                if "gpu_ms" in r
                else r.get("error", "-")[:28]
            )
        print(f"{shape!s:22s}" + "".join(f"{c:>30s}" for c in cells))


def print_train_table(results: dict) -> None:
    print(f"{'case':26s} {'method':8s}" + "".join(f"{k + ' gpu/wall ms':>26s}" for k in results))
    for i, (name, *_) in enumerate(TRAIN_SHAPES):
        for j, method in enumerate(TRAIN_METHODS):
            cells = []
            for rows in results.values():
                idx = i * len(TRAIN_METHODS) + j
                r = rows[idx] if idx < len(rows) else {}
                cells.append(
                    f"{r['gpu_ms']:.3f} / {r['wall_ms']:.3f}"
                    if "gpu_ms" in r
                    else r.get("error", "-")[:24]
                )
            print(f"{name:26s} {method:8s}" + "".join(f"{c:>26s}" for c in cells))
    best = {}
    for impl, rows in results.items():
        for r in rows:
            if "gpu_ms" in r:
                key = (r["case"], impl)
                best[key] = min(best.get(key, float("inf")), r["gpu_ms"])
    for name, *_ in TRAIN_SHAPES:
        ours_auto = next((r["gpu_ms"] for r in results.get("ours", []) if r.get("case") == name
                          and r.get("method") == "auto" and "gpu_ms" in r), None)  # fmt: skip
        peer = best.get((name, "lik"))
        if ours_auto and peer:
            print(f"{name:26s} ours auto {ours_auto:.3f} ms, best published {peer:.3f} ms: "
                  f"{peer / ours_auto:.2f}x")  # fmt: skip


WORKERS = {"forward": worker, "train": train_worker, "fp8": fp8_worker, "topk": topk_worker}

if __name__ == "__main__":
    main()
