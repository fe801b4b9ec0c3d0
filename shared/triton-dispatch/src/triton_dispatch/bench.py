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
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .device import device_facts


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
    host they are counts of calls.
    """
    device = torch.device(device)
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    for _ in range(max(warmup // 5, 1)):
        fn()
    times = []
    for _ in range(max(rep // 10, 3)):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


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
    exception's text in ``extra['baseline_error']``.
    """
    info: dict[str, Any] = dict(extra or {})
    base_ms = base_peak = base_wall = None
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


def write_json(
    records: Sequence[BenchRecord], path: str | Path, *, meta: Mapping[str, Any] | None = None
) -> Path:
    """Write ``records`` (and optional metadata such as the command line) to ``path`` as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": dict(meta or {}), "records": [r.to_json() for r in records]}
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
