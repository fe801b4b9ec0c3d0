"""First-call latency: what a fresh process pays at each new shape, with empty and warm caches.

Every case runs in its own Python process with its own Triton cache folder (``TRITON_CACHE_DIR``)
and its own autotuning-results folder (``TRITON_DISPATCH_CACHE_DIR``), both empty unless the case
re-uses an earlier case's folders ("warm disk cache"). Times are wall seconds of the call with a
device synchronisation after it, as a user feels them.

Cases:
* MaxSim, bf16, d=128: ten new shapes (queries 1-64, query tokens 20-128, document tokens
  77-1100), each a first inference forward, then a first forward+backward. Ours cold, ours again
  with the warm disk caches, ours after ``warmup()`` of the ten shapes, and the published peers
  (``--peers DIR`` holding ``late_interaction_kernels`` 0.4.5 under ``DIR/lik`` and
  ``flash_maxsim`` 0.3.0 under ``DIR/flash``), each with only its own folder on ``PYTHONPATH``.
* tomo-kplanes: the first training step at 200³, C=32, T=4 (the benchmark's fused, folded step),
  cold and with warm disk caches.
* vq-kernels: the first ``ResidualVQ(64, 256, 3)`` training step on 640 rows, cold and warm.

    python3 tools/gpu/cold_start.py --out cold_start.json [--peers DIR] [--only maxsim,tomo,vq]
        [--repeat N]

The vq child records its process's timeline (the import, the background start's steps, each
compile's thread and end) in seconds after the first step began; ``COLD_START_PAUSE=S`` waits S
seconds between building the module and its first step (a first step that follows the import
later, as after loading data).

``--profile`` samples the main thread's stack every few milliseconds during the first ResidualVQ
step (wall time, so waits on background compiles and subprocesses show) and keeps the heaviest
stacks in the JSON.

Writes the JSON and prints one markdown table per package (what BENCHMARKS.md keeps).
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

#: (queries, documents, query tokens, document tokens): in-batch training, reranking, ColPali
MAXSIM_SHAPES = [
    (1, 1000, 32, 300),
    (64, 64, 32, 180),
    (32, 32, 20, 77),
    (16, 16, 128, 1100),
    (8, 64, 64, 512),
    (2, 500, 48, 220),
    (48, 48, 24, 300),
    (4, 128, 100, 1024),
    (24, 24, 32, 256),
    (12, 200, 80, 700),
]


# -- children: one case each, printing one JSON line ----------------------------------------------


def _sync():
    import torch

    torch.cuda.synchronize()


def _timed(fn) -> float:
    _sync()
    start = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - start


def child_maxsim(impl: str, warm_first: bool) -> dict:
    start = time.perf_counter()
    import torch

    if impl == "ours":
        from late_interaction_kernels import maxsim as forward
        from late_interaction_kernels import warmup

        train = forward
    elif impl == "lik045":
        from late_interaction_kernels import maxsim as forward

        train = forward
    elif impl == "flash":
        from flash_maxsim import flash_maxsim_batched as forward
        from flash_maxsim import flash_maxsim_batched_train as train
    else:
        raise ValueError(impl)
    torch.empty(1, device="cuda")
    out: dict = {"impl": impl, "import_s": time.perf_counter() - start, "shapes": []}
    if warm_first:
        specs = ["x".join(map(str, s)) for s in MAXSIM_SHAPES]
        report = warmup(specs, device="cuda")
        out["warmup_s"] = report.seconds
        out["warmup_compiled"] = report.compiled
    g = torch.Generator(device="cuda").manual_seed(0)
    for nq, nd, lq, ld in MAXSIM_SHAPES:
        Q = torch.randn(nq, lq, 128, device="cuda", generator=g, dtype=torch.bfloat16)
        D = torch.randn(nd, ld, 128, device="cuda", generator=g, dtype=torch.bfloat16)
        with torch.no_grad():
            fwd = _timed(lambda Q=Q, D=D: forward(Q, D))
        Qg, Dg = Q.clone().requires_grad_(), D.clone().requires_grad_()
        fb = _timed(lambda Qg=Qg, Dg=Dg: train(Qg, Dg).sum().backward())
        again = _timed(lambda Qg=Qg, Dg=Dg: train(Qg, Dg).sum().backward())
        out["shapes"].append({"shape": [nq, nd, lq, ld], "forward_s": fwd, "train_s": fb,
                              "second_train_s": again})  # fmt: skip
    out["total_s"] = sum(s["forward_s"] + s["train_s"] for s in out["shapes"])
    if impl == "ours":
        out.update(_selection_summary("late_interaction_kernels"))
    return out


def _selection_summary(package: str) -> dict:
    from triton_dispatch import benchmark_count, tuned_kernels
    from triton_dispatch.compile_ahead import submitted_count

    sources: dict[str, int] = {}
    for kernel in tuned_kernels(package):
        for source in kernel.sources.values():
            sources[source] = sources.get(source, 0) + 1
    return {"benchmarks": benchmark_count(), "config_sources": sources,
            "compiled_ahead": submitted_count()}  # fmt: skip


def child_tomo() -> dict:
    import importlib.util

    import torch

    path = ROOT / "packages" / "tomo-kplanes" / "benchmarks" / "training_step.py"
    spec = importlib.util.spec_from_file_location("tomo_training_step", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from triton_dispatch.warmup import counting_compiles

    torch.empty(1, device="cuda")
    build = time.perf_counter()
    step = module.make_step(200, 32, 4, 1024, 200, 10_000, fused=True, fold=True, device="cuda")
    build = time.perf_counter() - build
    with counting_compiles() as count:
        first = _timed(step)
    second = _timed(step)
    return {"build_s": build, "first_step_s": first, "second_step_s": second,
            "compiled": count.compiled, "loaded": count.loaded,
            "compile_s": count.seconds, "by_kernel": count.by_kernel,
            **_selection_summary("tomo_kplanes")}  # fmt: skip


class StackSampler:
    """Samples the main thread's Python stack every ``interval`` seconds on a side thread: where
    the wall time of a first call goes, waits included (cProfile counts CPU time of one thread)."""

    def __init__(self, interval: float = 0.005, depth: int = 8) -> None:
        import threading

        self.interval, self.depth = interval, depth
        self.main = threading.main_thread().ident
        self.counts: dict[str, int] = {}
        self.samples = 0
        self.phases: list[list] = []  # [start s, end s, innermost frames], in time order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self.main)
            names = []
            while frame is not None and len(names) < 40:
                code = frame.f_code
                names.append(f"{Path(code.co_filename).name}:{code.co_name}")
                frame = frame.f_back
            key = " < ".join(names[: self.depth])
            self.counts[key] = self.counts.get(key, 0) + 1
            self.samples += 1
            now, inner = time.perf_counter(), " < ".join(names[:4])
            if self.phases and self.phases[-1][2] == inner:
                self.phases[-1][1] = now
            else:
                self.phases.append([now, now, inner])

    def __enter__(self) -> StackSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def top(self, n: int = 30) -> list[dict]:
        ranked = sorted(self.counts.items(), key=lambda kv: -kv[1])[:n]
        return [{"ms": c * self.interval * 1e3, "stack": k} for k, c in ranked]

    def timeline(self, origin: float, min_s: float = 0.01) -> list[list]:
        """The main thread's innermost frames in time order, as ``[start, end, frames]`` in
        seconds after ``origin``, the runs of one stack shorter than ``min_s`` left out."""
        return [[round(a - origin, 3), round(b - origin, 3), f] for a, b, f in self.phases
                if b - a + self.interval >= min_s]  # fmt: skip


def _compile_timeline(origin: float):
    """A Triton compilation listener (chained to any set) that appends, per compiled kernel, its
    thread, when it ended (seconds after ``origin``) and its stages' seconds; and the list."""
    import threading

    from triton import knobs

    events: list[dict] = []
    previous = knobs.compilation.listener

    def listen(*, src, metadata, metadata_group, times, cache_hit):
        stages = {"ir": times.ir_initialization / 1e6}
        stages.update((k, v / 1e6) for k, v in times.lowering_stages)
        events.append({"kernel": getattr(src, "name", "?"), "thread": threading.current_thread().name,
                       "end_s": time.perf_counter() - origin, "total_s": times.total / 1e6,
                       "cache_hit": cache_hit, "stages_s": stages})  # fmt: skip
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                     cache_hit=cache_hit)  # fmt: skip

    knobs.compilation.listener = listen
    return events


def child_vq() -> dict:
    import contextlib

    begin = time.perf_counter()
    import torch

    from triton_dispatch.warmup import counting_compiles
    from vq_kernels import ResidualVQ

    imported = time.perf_counter()
    torch.manual_seed(0)
    module = ResidualVQ(64, 256, 3).to("cuda")
    x = torch.randn(640, 64, device="cuda", requires_grad=True)
    torch.cuda.synchronize()
    if os.environ.get("COLD_START_PAUSE"):  # a first step that comes later after the import
        time.sleep(float(os.environ["COLD_START_PAUSE"]))

    def step():
        out = module(x)
        (out.quantized.square().mean() + out.loss).backward()

    profiling = os.environ.get("COLD_START_PROFILE") == "1"
    sampler = StackSampler() if profiling else contextlib.nullcontext()
    step_start = time.perf_counter()
    events = _compile_timeline(step_start)
    with counting_compiles() as count, sampler:
        first = _timed(step)
    second = _timed(step)
    profile = (
        {"profile": sampler.top(), "main_thread": sampler.timeline(step_start)} if profiling else {}
    )
    from triton_dispatch import prime

    started = prime.started_at()
    profile["prime"] = {"finished": prime.finished(), "errors": prime.errors(),
                        "spans_s": prime.spans()}  # fmt: skip
    # the process's timeline, seconds after the step began: negative before it
    profile["timeline"] = {
        "import_start_s": begin - step_start, "import_end_s": imported - step_start,
        "prime_start_s": None if started is None else started - step_start,
        "compiles": events,
    }  # fmt: skip
    return {"first_step_s": first, "second_step_s": second, "compiled": count.compiled,
            "loaded": count.loaded, "compile_s": count.seconds, "by_kernel": count.by_kernel,
            **_selection_summary("vq_kernels"), **profile}  # fmt: skip


# -- the parent ------------------------------------------------------------------------------------


def run_child(case: str, args: list[str], *, triton_cache: Path, tuning_cache: Path,
              pythonpath: list[Path], timeout: int = 420) -> dict:  # fmt: skip
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env.update(
        TRITON_CACHE_DIR=str(triton_cache),
        TRITON_DISPATCH_CACHE_DIR=str(tuning_cache),
        PYTHONPATH=os.pathsep.join(str(p) for p in pythonpath),
        PYTHONUNBUFFERED="1",
    )
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", case, *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    wall = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"case": case, "error": (proc.stdout + proc.stderr)[-3000:], "process_s": wall}
    result = json.loads(lines[-1])
    result.update(case=case, process_s=wall)
    return result


def maxsim_cases(tmp: Path, peers: Path | None) -> list[dict]:
    cold_t, cold_a = tmp / "triton-maxsim", tmp / "tuning-maxsim"
    results = [
        run_child("maxsim", ["ours"], triton_cache=cold_t, tuning_cache=cold_a, pythonpath=SOURCES),
        run_child("maxsim", ["ours"], triton_cache=cold_t, tuning_cache=cold_a, pythonpath=SOURCES),
        run_child("maxsim", ["ours", "--warm-first"], triton_cache=tmp / "triton-maxsim-w",
                  tuning_cache=tmp / "tuning-maxsim-w", pythonpath=SOURCES),
    ]  # fmt: skip
    for r, label in zip(results, ("ours, cold", "ours, warm disk cache", "ours after warmup()")):
        r["label"] = label
    if peers is not None:
        for impl, folder, label in (("lik045", "lik", "late-interaction-kernels 0.4.5, cold"),
                                    ("flash", "flash", "flash-maxsim 0.3.0, cold")):  # fmt: skip
            if (peers / folder).is_dir():
                r = run_child("maxsim", [impl], triton_cache=tmp / f"triton-{impl}",
                              tuning_cache=tmp / f"tuning-{impl}", pythonpath=[peers / folder])  # fmt: skip
                r["label"] = label
                results.append(r)
    return results


def step_cases(case: str, tmp: Path, repeat: int = 1) -> list[dict]:
    """Cold then warm, ``repeat`` times, each round with folders of its own."""
    results = []
    for round_ in range(repeat):
        t, a = tmp / f"triton-{case}-{round_}", tmp / f"tuning-{case}-{round_}"
        cold = run_child(case, [], triton_cache=t, tuning_cache=a, pythonpath=SOURCES)
        warm = run_child(case, [], triton_cache=t, tuning_cache=a, pythonpath=SOURCES)
        suffix = f" (round {round_ + 1})" if repeat > 1 else ""
        cold["label"], warm["label"] = "cold" + suffix, "warm disk cache" + suffix
        results += [cold, warm]
    return results


def markdown(results: dict) -> str:
    out = []
    rows = results.get("maxsim", [])
    if rows:
        out.append("| MaxSim first calls (10 shapes) | total s | worst forward s | worst fwd+bwd s | "
                   "(1, 1000, 32, 300) forward s | process s |")  # fmt: skip
        out.append("| --- | --- | --- | --- | --- | --- |")
        for r in rows:
            if "error" in r:
                out.append(f"| {r.get('label', r['case'])} | error | | | | |")
                continue
            shapes = r["shapes"]
            extra = f" (+{r['warmup_s']:.2f} s warm-up)" if "warmup_s" in r else ""
            out.append(
                f"| {r['label']}{extra} | {r['total_s']:.2f} | "
                f"{max(s['forward_s'] for s in shapes):.2f} | "
                f"{max(s['train_s'] for s in shapes):.2f} | {shapes[0]['forward_s']:.2f} | "
                f"{r['process_s']:.1f} |"
            )
    for case, title in (("tomo", "tomo 200³ C=32 T=4 training step"),
                        ("vq", "ResidualVQ 3×256×64 training step")):  # fmt: skip
        rows = results.get(case, [])
        if rows:
            out.append(f"\n| {title} | first step s | second step s | kernels compiled |")
            out.append("| --- | --- | --- | --- |")
            for r in rows:
                if "error" in r:
                    out.append(f"| {r['label']} | error | | |")
                else:
                    out.append(f"| {r['label']} | {r['first_step_s']:.2f} | "
                               f"{r['second_step_s'] * 1e3:.1f} ms | {r['compiled']} |")  # fmt: skip
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("cold_start.json"))
    parser.add_argument("--peers", type=Path, default=None)
    parser.add_argument("--only", default="maxsim,tomo,vq")
    parser.add_argument("--profile", action="store_true", help="sample the first vq step")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the tomo and vq cases")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--warm-first", action="store_true", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.child:
        if args.child == "maxsim":
            result = child_maxsim(rest[0], args.warm_first)
        else:
            result = {"tomo": child_tomo, "vq": child_vq}[args.child]()
        print(json.dumps(result))
        return
    only = set(args.only.split(","))
    if args.profile:
        os.environ["COLD_START_PROFILE"] = "1"
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="cold-start-") as tmp:
        if "maxsim" in only:
            results["maxsim"] = maxsim_cases(Path(tmp), args.peers)
        for case in ("tomo", "vq"):
            if case in only:
                results[case] = step_cases(case, Path(tmp), args.repeat)
    import torch
    import triton

    results["meta"] = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(sys.argv),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    table = markdown(results)
    args.out.with_suffix(".md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
