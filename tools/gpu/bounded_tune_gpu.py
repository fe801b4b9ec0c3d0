"""The first-call short tune on a real GPU: the card stands in for one without a table of its own
(``--as`` a known card, default an NVIDIA GH200 480GB: same sm_90 kernels, no shipped rows), so
every regime's first call times its short list for real. Each workload runs in a fresh process
with empty Triton and tuning caches, once standing in for that card (short tune on) and once as
itself (its own table), and a third time standing in again with the tuning cache the first run
left (a later process on that card: nothing timed).

Per workload: the first call's wall time (compiles and the short tune included), the warm
``do_bench`` median, how each kernel's config was chosen, and the trials run.

    python3 tools/gpu/bounded_tune_gpu.py --out bounded_tune_gpu.json
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
SOURCES = [
    ROOT / "shared" / "triton-dispatch" / "src",
    *sorted(p / "src" for p in (ROOT / "packages").iterdir() if (p / "src").is_dir()),
]
WORKLOADS = ("maxsim-retrieval", "maxsim-train", "vq-quantize", "vq-rvq-step", "tomo-features")


def _workload(name: str):
    """``(package, call)`` of one workload on CUDA tensors (inputs made here, outside the call)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)

    if name == "maxsim-retrieval":
        from late_interaction_kernels import maxsim

        q = torch.nn.functional.normalize(randn(1, 32, 128), dim=-1).bfloat16()
        d = torch.nn.functional.normalize(randn(10000, 300, 128), dim=-1).bfloat16()
        return "late_interaction_kernels", lambda: maxsim(q, d)
    if name == "maxsim-train":
        from late_interaction_kernels import maxsim

        q = randn(32, 32, 128, dtype=torch.bfloat16).requires_grad_()
        d = randn(32, 300, 128, dtype=torch.bfloat16).requires_grad_()
        return "late_interaction_kernels", lambda: maxsim(q, d).sum().backward()
    if name == "vq-quantize":
        from vq_kernels import quantize

        x, cb = randn(65536, 128, dtype=torch.bfloat16), randn(4096, 128, dtype=torch.bfloat16)
        return "vq_kernels", lambda: quantize(x, cb)
    if name == "vq-rvq-step":
        from vq_kernels import ResidualVQ

        torch.manual_seed(0)
        module = ResidualVQ(64, 256, 3).to("cuda")
        x = randn(640, 64).requires_grad_()

        def step():
            out = module(x)
            (out.quantized.square().mean() + out.loss).backward()

        return "vq_kernels", step
    if name == "tomo-features":
        from tomo_kplanes.ops import tilted_plane_features

        points = torch.rand(204_800, 3, device="cuda", generator=g) * 2 - 1
        rot = torch.eye(3, device="cuda") + 0.05 * randn(4, 3, 3)
        planes = torch.rand(12, 32, 200, 200, device="cuda", generator=g)
        planes = planes.contiguous(memory_format=torch.channels_last)
        return "tomo_kplanes", lambda: tilted_plane_features(points, rot, planes)
    raise ValueError(name)


def child(name: str, stand_in: str | None) -> dict:
    import contextlib

    import torch
    import triton.testing

    from triton_dispatch import benchmark_count, tuned_kernels
    from triton_dispatch.cards import known_card
    from triton_dispatch.device import simulated_device

    torch.empty(1, device="cuda")
    package, call = _workload(name)
    if stand_in is None:
        context = contextlib.nullcontext()
    else:
        card = known_card(stand_in)
        if card is None:
            raise SystemExit(f"unknown card {stand_in!r}")
        context = simulated_device(card.facts())
    with context:
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        trials = benchmark_count()
        warm = triton.testing.do_bench(call, rep=100)
    sources: dict[str, int] = {}
    for kernel in tuned_kernels(package):
        for source in kernel.sources.values():
            sources[source] = sources.get(source, 0) + 1
    return {"first_call_s": first, "warm_ms": warm, "trials": trials, "config_sources": sources}


def run_child(name: str, stand_in: str | None, cache: Path, triton_cache: Path) -> dict:
    env = dict(os.environ)
    for var in ("TRITON_INTERPRET", "TRITON_DISPATCH_AUTOTUNE", "TRITON_DISPATCH_BOUNDED_TUNE"):
        env.pop(var, None)
    env.update(
        TRITON_CACHE_DIR=str(triton_cache),
        TRITON_DISPATCH_CACHE_DIR=str(cache),
        PYTHONPATH=os.pathsep.join(str(p) for p in SOURCES),
    )
    args = [sys.executable, __file__, "--child", name] + (["--as", stand_in] if stand_in else [])
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stdout + proc.stderr)[-2000:]}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bounded_tune_gpu.json"))
    parser.add_argument("--as", dest="stand_in", default="NVIDIA GH200 480GB")
    parser.add_argument("--only", default=",".join(WORKLOADS))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.stand_in if "--as" in sys.argv else None)))
        return
    import torch

    rows = []
    with tempfile.TemporaryDirectory(prefix="bounded-") as tmp:
        for name in args.only.split(","):
            folder = Path(tmp) / name
            own = run_child(name, None, folder / "own-cache", folder / "own-triton")
            short = run_child(name, args.stand_in, folder / "cache", folder / "triton")
            later = run_child(name, args.stand_in, folder / "cache", folder / "triton")
            rows.append({"workload": name, "own_table": own, "short_tune": short,
                         "later_process": later})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    result = {"device": torch.cuda.get_device_name(0), "stand_in": args.stand_in,
              "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "rows": rows}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{result['device']} standing in for {args.stand_in}")
    print("| workload | own table: first call s, warm ms | short tune: first call s, warm ms, "
          "trials | later process: first call s, warm ms |")  # fmt: skip
    print("| --- | --- | --- | --- |")
    for r in rows:
        cells = []
        for key in ("own_table", "short_tune", "later_process"):
            c = r[key]
            if "error" in c:
                cells.append("error")
                continue
            cell = f"{c['first_call_s']:.2f}, {c['warm_ms']:.4f}"
            if key == "short_tune":
                cell += f", {c['trials']} ({c['config_sources']})"
            cells.append(cell)
        print(f"| {r['workload']} | " + " | ".join(cells) + " |")
    for r in rows:
        for key in ("own_table", "short_tune", "later_process"):
            if "error" in r[key]:
                print(f"ERROR {r['workload']} {key}: {r[key]['error'][-800:]}")


if __name__ == "__main__":
    main()
