"""Benchmark kit: median time with warm-up, peak memory, and a result record printed as a table
and written as JSON.

On CUDA, times come from ``triton.testing.do_bench`` (median, L2 flushed between runs); on the host
from a wall-clock loop (median of ``rep`` runs after ``warmup`` runs). Ratios are
``baseline_ms / ours_ms``: above 1 means we are faster.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import autotune_mode
from .device import device_facts

#: ``0`` times ``ours`` alone in :func:`compare` (comparisons of our own configurations, such as
#: the launch tables against autotuning, need no baseline and skip its compiles).
BASELINES_ENV_VAR = "TRITON_DISPATCH_BENCH_BASELINES"
#: ``1`` times each CUDA call as the replay of a CUDA graph of that one call, with ``do_bench``'s
#: L2 flush before every replay (:func:`median_ms`): the kernels' own time, which ``do_bench``'s
#: events cannot see past the host on calls whose launches take longer than their kernels (a
#: few microseconds of work, or an op of several launches with Python between them), while a
#: read-bound call still meets cold L2 as it does in use. Comparisons of launch configurations
#: need it: two processes' hosts differ more than two configs' kernels.
GRAPHS_ENV_VAR = "TRITON_DISPATCH_BENCH_GRAPHS"


def synchronize(device: torch.device | str | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(
    fn: Callable[[], Any],
    *,
    device: torch.device | str = "cpu",
    warmup: int = 25,
    rep: int = 100,
) -> float:
    """Median milliseconds of ``fn()``.

    On CUDA ``warmup`` and ``rep`` are milliseconds of ``do_bench`` (as Triton defines them); on the
    host they are counts of calls. With ``TRITON_DISPATCH_BENCH_GRAPHS=1`` a CUDA call is timed
    as the replay of a graph of one call (:data:`GRAPHS_ENV_VAR`); a call that cannot be
    captured (a host sync, a host tensor) keeps ``do_bench``'s time of the call itself.
    """
    device = torch.device(device)
    if device.type == "cuda":
        import triton.testing

        if os.environ.get(GRAPHS_ENV_VAR, "0").strip() == "1":
            for _ in range(3):  # regimes chosen and kernels compiled before the capture
                fn()
            synchronize(device)
            graph = _one_call_graph(fn, device)
            if graph is not None:
                fn = graph.replay
        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    for _ in range(max(warmup // 5, 1)):
        fn()
    times = []
    for _ in range(max(rep // 10, 3)):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _one_call_graph(fn: Callable[[], Any], device: torch.device) -> torch.cuda.CUDAGraph | None:
    """A CUDA graph of one call of ``fn`` (already warm: its regimes chosen, its kernels
    compiled), or ``None`` when the call cannot be captured."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception:  # a host sync or a host tensor inside: not capturable
        torch.cuda.synchronize(device)
        return None
    return graph


def wall_ms_per_call(
    fn: Callable[[], Any], *, device: torch.device | str = "cpu", calls: int = 200, warmup: int = 10
) -> float:
    """Wall-clock milliseconds per call of ``fn`` as a user's loop feels it: ``calls`` back-to-back
    calls timed on the host with one synchronize at the end (host work and launch gaps included,
    which ``do_bench``'s GPU-side events hide while the GPU queue stays full)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / calls * 1e3


def peak_memory_bytes(
    fn: Callable[[], Any], *, device: torch.device | str = "cpu", warm: bool = True
) -> int | None:
    """Peak device memory that one call of ``fn`` allocates above what was allocated before it.

    With ``warm`` (the default) ``fn`` runs once first, so autotuning and compilation, which
    allocate benchmark buffers of their own, are not counted. ``None`` on the host, where torch
    keeps no allocator statistics.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    if warm:
        fn()  # compile and autotune first: their scratch buffers are not the op's memory
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - before)


def collective_ms(
    fn: Callable[[], Any],
    *,
    device: torch.device | str = "cpu",
    calls: int = 50,
    warmup: int = 5,
    group: Any = None,
    together: bool = True,
) -> dict[str, float]:
    """Time a step that runs collectives: the same number of calls on every rank of ``group``
    (``do_bench`` picks its count per process, and ranks that launch different numbers of
    collectives hang), started together after a barrier.

    Returns ``gpu_ms`` (median of per-call CUDA-event timings, the queue kept full; on the host,
    the median wall time of a call), ``loop_gpu_ms`` (one pair of events around ``calls``
    back-to-back calls, divided by ``calls``: the steady-state throughput of a training loop, in
    which one rank's late launch is absorbed by the queue instead of counted per call) and
    ``wall_ms`` (host clock around the same loop, one synchronize at the end). Every rank gets its
    own figures; the slowest rank's are the step's. ``together=False`` skips the barriers: one
    rank timing a single-GPU step while the others wait.
    """
    import torch.distributed as dist

    def barrier() -> None:
        synchronize(device)
        if together and dist.is_available() and dist.is_initialized():
            dist.barrier(group=group)

    device = torch.device(device)
    for _ in range(warmup):
        fn()
    barrier()
    per_call: list[float] = []
    if device.type == "cuda":
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(calls)
        ]
        for start, end in events:
            start.record()
            fn()
            end.record()
        synchronize(device)
        per_call = [start.elapsed_time(end) for start, end in events]
        barrier()
    loop_start = loop_end = None
    if device.type == "cuda":
        loop_start = torch.cuda.Event(enable_timing=True)
        loop_end = torch.cuda.Event(enable_timing=True)
        loop_start.record()
    t0 = time.perf_counter()
    host: list[float] = []
    for _ in range(calls):
        t1 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t1) * 1e3)
    if loop_end is not None:
        loop_end.record()
    synchronize(device)
    wall = (time.perf_counter() - t0) / calls * 1e3
    barrier()
    loop = loop_start.elapsed_time(loop_end) / calls if loop_start is not None else wall
    return {
        "gpu_ms": statistics.median(per_call) if per_call else statistics.median(host),
        "loop_gpu_ms": loop,
        "wall_ms": wall,
    }


def profile_step(
    fn: Callable[[], Any],
    *,
    device: torch.device | str = "cpu",
    calls: int = 20,
    warmup: int = 3,
    top: int = 8,
    python_top: int = 0,
    together: bool = True,
) -> dict[str, Any]:
    """Where the time of a step goes, per call: the host time that enqueues it, and on CUDA the
    GPU time by kind — collectives (NCCL kernels, which include the time a rank waits for its
    peers), other kernels, copies and fills — the GPU's busy time (the union of those intervals,
    streams overlapping), the span from the first to the last of them, and the idle time in
    between (waits on the host or on another rank that no kernel covers). ``top``: the kernels
    that take the most time, with their launches per call. ``python_top``: that many Python
    functions with the most host time of their own (``cProfile`` over ``calls`` more calls; its
    overhead inflates the figures, so read them against each other).

    Under a process group every phase starts after a barrier (``together=False``: one rank
    alone). Runs ``calls`` calls under ``torch.profiler`` (CUDA activity only, so the host figures come
    from a separate unprofiled loop). A collective step must be profiled on every rank.
    """
    import tempfile

    import torch.distributed as dist

    def barrier() -> None:
        synchronize(device)
        if together and dist.is_available() and dist.is_initialized():
            dist.barrier()

    device = torch.device(device)
    for _ in range(warmup):
        fn()
    barrier()
    host = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
    synchronize(device)
    out: dict[str, Any] = {"calls": calls, "host_ms": statistics.median(host)}
    if python_top:
        barrier()
        out["python"] = _python_profile(fn, device, calls, python_top)
    if device.type != "cuda":
        return out
    from torch.profiler import ProfilerActivity, profile

    barrier()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        synchronize(device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    kinds = {"kernel": "compute", "gpu_memcpy": "copy", "gpu_memset": "fill"}
    spans: list[tuple[float, float]] = []
    by_kind = dict.fromkeys(("collective", "compute", "copy", "fill"), 0.0)
    by_name: dict[str, list[float]] = {}
    for e in trace.get("traceEvents", []):
        kind = kinds.get(e.get("cat", ""))
        if kind is None or e.get("ph") != "X":
            continue
        start, dur = float(e["ts"]), float(e.get("dur", 0.0))
        name = str(e.get("name", ""))
        if kind == "compute" and "nccl" in name.lower():
            kind = "collective"
        by_kind[kind] += dur
        spans.append((start, start + dur))
        entry = by_name.setdefault(name[:80], [0.0, 0])
        entry[0] += dur
        entry[1] += 1
    busy = 0.0
    end = float("-inf")
    for a, b in sorted(spans):
        if b > end:
            busy += b - max(a, end)
            end = b
    span = (max(b for _, b in spans) - min(a for a, _ in spans)) if spans else 0.0
    per = 1e-3 / calls  # microseconds in total -> milliseconds per call
    out.update(
        {f"{k}_ms": v * per for k, v in by_kind.items()},
        busy_ms=busy * per,
        span_ms=span * per,
        idle_ms=(span - busy) * per,
        top=[
            {"kernel": n, "ms": t * per, "per_call": c / calls}
            for n, (t, c) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
        ],
    )
    return out


def _python_profile(fn: Callable[[], Any], device, calls: int, top: int) -> list[dict[str, Any]]:
    import cProfile
    import os
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    synchronize(device)
    rows = []
    for (path, line, func), (_, ncalls, own, total, _) in pstats.Stats(profiler).stats.items():
        rows.append(
            {
                "function": f"{os.path.basename(path)}:{line}({func})",
                "own_us": own / calls * 1e6,
                "total_us": total / calls * 1e6,
                "per_call": ncalls / calls,
            }
        )
    return sorted(rows, key=lambda r: -r["own_us"])[:top]


def format_profile(name: str, p: Mapping[str, Any]) -> str:
    """One line of :func:`profile_step`'s figures, then its top kernels."""
    keys = ("host_ms", "span_ms", "busy_ms", "idle_ms", "collective_ms", "compute_ms", "copy_ms",
            "fill_ms")  # fmt: skip
    line = f"{name}: " + "  ".join(f"{k[:-3]} {p[k]:.3f}" for k in keys if k in p)
    tops = [f"    {t['ms']:.3f} ms x{t['per_call']:g}  {t['kernel']}" for t in p.get("top", [])]
    python = [
        f"    host {r['own_us']:7.1f} us own {r['total_us']:8.1f} us total x{r['per_call']:g}  "
        f"{r['function']}"
        for r in p.get("python", [])
    ]
    return "\n".join([line, *tops, *python])


def environment(device: torch.device | str = "cpu") -> dict[str, str]:
    """Device, versions and date for a benchmark record."""
    device = torch.device(device)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    return {
        "device": device_facts(device).name
        if device.type == "cuda"
        else f"cpu ({platform.processor() or platform.machine()})",
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "date": _dt.date.today().isoformat(),
    }


@dataclass
class BenchRecord:
    """One measured case: our op against the baseline a user would otherwise run."""

    name: str
    shape: dict[str, Any]
    baseline: str
    baseline_ms: float | None
    ours_ms: float | None
    baseline_peak_bytes: int | None = None
    ours_peak_bytes: int | None = None
    baseline_wall_ms: float | None = None
    ours_wall_ms: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        """``baseline_ms / ours_ms`` (> 1: ours is faster)."""
        if not self.baseline_ms or not self.ours_ms:
            return None
        return self.baseline_ms / self.ours_ms

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ratio"] = self.ratio
        return data


def compare(
    name: str,
    shape: Mapping[str, Any],
    *,
    ours: Callable[[], Any],
    baseline: Callable[[], Any] | None,
    baseline_name: str,
    device: torch.device | str = "cpu",
    warmup: int = 25,
    rep: int = 100,
    measure_memory: bool = True,
    measure_wall: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> BenchRecord:
    """Time ``ours`` and ``baseline`` in the same run: ``do_bench`` median (GPU time on CUDA) and,
    with ``measure_wall``, wall time per call (:func:`wall_ms_per_call`), and peak memory on CUDA.

    A baseline that raises (out of memory, say) is recorded with ``baseline_ms=None`` and the
    exception's text in ``extra['baseline_error']``. With ``TRITON_DISPATCH_BENCH_BASELINES=0``
    the baseline is not run (``extra['baseline_skipped']``).
    """
    info: dict[str, Any] = dict(extra or {})
    base_ms = base_peak = base_wall = None
    if baseline is not None and os.environ.get(BASELINES_ENV_VAR, "1").strip() == "0":
        info["baseline_skipped"] = True
        baseline = None
    if baseline is not None:
        try:
            base_peak = peak_memory_bytes(baseline, device=device) if measure_memory else None
            base_ms = median_ms(baseline, device=device, warmup=warmup, rep=rep)
            base_wall = wall_ms_per_call(baseline, device=device) if measure_wall else None
        except Exception as exc:
            info["baseline_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()
    our_peak = peak_memory_bytes(ours, device=device) if measure_memory else None
    our_ms = median_ms(ours, device=device, warmup=warmup, rep=rep)
    our_wall = wall_ms_per_call(ours, device=device) if measure_wall else None
    return BenchRecord(
        name=name,
        shape=dict(shape),
        baseline=baseline_name,
        baseline_ms=base_ms,
        ours_ms=our_ms,
        baseline_peak_bytes=base_peak,
        ours_peak_bytes=our_peak,
        baseline_wall_ms=base_wall,
        ours_wall_ms=our_wall,
        env=environment(device),
        extra=info,
    )


def _fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


def _fmt_mb(v: int | None) -> str:
    return "-" if v is None else f"{v / 2**20:.1f}"


def format_table(records: Iterable[BenchRecord]) -> str:
    """A plain-text table: name, shape, baseline, ms, ours ms, ratio, peak MiB."""
    rows = [
        ("case", "shape", "baseline", "base ms", "ours ms", "ratio", "base wall", "ours wall",
         "base MiB", "ours MiB"),
    ]  # fmt: skip
    for r in records:
        shape = ",".join(f"{k}={v}" for k, v in r.shape.items())
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        rows.append(
            (
                r.name,
                shape,
                r.baseline,
                _fmt_ms(r.baseline_ms),
                _fmt_ms(r.ours_ms),
                ratio,
                _fmt_ms(r.baseline_wall_ms),
                _fmt_ms(r.ours_wall_ms),
                _fmt_mb(r.baseline_peak_bytes),
                _fmt_mb(r.ours_peak_bytes),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def tuned_choices() -> dict[str, dict[str, str]]:
    """The launch config every tuned kernel of this process took for each regime it met,
    ``{"package.kernel": {regime: config}}`` (both as sorted JSON text): what two runs of one
    script compare to tell whether they launched the same kernels (a time that differs between
    runs that chose alike is the runs', not the configs')."""
    choices: dict[str, dict[str, str]] = {}
    for kernel in autotune_mode.tuned_kernels():
        picks = {
            json.dumps(dict(regime), sort_keys=True, default=str): json.dumps(
                _config_settings(config), sort_keys=True, default=str
            )
            for regime, config in dict(kernel.cache).items()
        }
        if picks:
            choices[f"{kernel.package}.{kernel.name}"] = picks
    return choices


def _config_settings(config: Any) -> dict[str, Any]:
    """A Triton ``Config``'s launch settings (its meta-parameters, warps, stages, CTAs)."""
    if hasattr(config, "all_kwargs"):
        return dict(config.all_kwargs())
    return {"config": str(config)}


def write_json(
    records: Sequence[BenchRecord], path: str | Path, *, meta: Mapping[str, Any] | None = None
) -> Path:
    """Write ``records`` (and optional metadata such as the command line) to ``path`` as JSON,
    with the tuned kernels' choices of this process (:func:`tuned_choices`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "meta": dict(meta or {}),
        "records": [r.to_json() for r in records],
        "choices": tuned_choices(),
    }
    path.write_text(json.dumps(payload, indent=2, default=str))
    return path


def benchmark_arguments(description: str) -> argparse.ArgumentParser:
    """The command-line arguments every benchmark script accepts: ``--out`` (JSON path),
    ``--quick`` (fewer, smaller cases) and ``--device``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=None, help="write the records as JSON here")
    parser.add_argument("--quick", action="store_true", help="few small cases (smoke test)")
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device"
    )
    return parser


def report(
    records: Sequence[BenchRecord], out: str | Path | None, *, meta: Mapping[str, Any] | None = None
) -> None:
    """Print the table and, when ``out`` is given, write the JSON."""
    print(format_table(records))
    if out is not None:
        write_json(records, out, meta=meta)
        print(f"wrote {out}")
