"""Warm-up: run the calls a step will make once, before the first step, and count what compiled.

Each package's ``warmup()`` builds small inputs of the shapes a user names and passes the op calls
here. :func:`run_warmup` runs them (on several threads when asked: Triton compiles in C++ and in
``ptxas`` subprocesses, so kernels of different calls can compile side by side), synchronises, and
reports how many kernels Triton compiled and how many it loaded from its disk cache.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from . import compile_ahead
from .backend import interpreter_enabled


@dataclass
class CompileCount:
    """Triton compilations seen while counting: ``compiled`` built anew, ``loaded`` from Triton's
    disk cache, ``seconds`` spent in both, and the new builds by kernel name."""

    compiled: int = 0
    loaded: int = 0
    seconds: float = 0.0
    by_kernel: dict[str, int] = field(default_factory=dict)


@contextlib.contextmanager
def counting_compiles() -> Iterator[CompileCount]:
    """Inside the block, count Triton's compilations (through ``knobs.compilation.listener``,
    chained to any listener already set). Counts nothing where Triton has no listener slot."""
    count = CompileCount()
    try:
        from triton import knobs
    except ImportError:
        yield count
        return
    if not hasattr(knobs.compilation, "listener"):
        yield count
        return
    previous = knobs.compilation.listener
    lock = threading.Lock()

    def listen(*, src, metadata, metadata_group, times, cache_hit):
        with lock:
            if cache_hit:
                count.loaded += 1
            else:
                count.compiled += 1
                name = getattr(src, "name", "?")
                count.by_kernel[name] = count.by_kernel.get(name, 0) + 1
            total = getattr(times, "total", None)  # microseconds (knobs.CompileTimes)
            if isinstance(total, (int, float)):
                count.seconds += total / 1e6
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                     cache_hit=cache_hit)  # fmt: skip

    knobs.compilation.listener = listen
    try:
        yield count
    finally:
        knobs.compilation.listener = previous


@dataclass
class WarmupReport:
    """What a warm-up did: wall ``seconds``, the ``calls`` run, Triton's compile counts and the
    seconds its compiler ran (summed over threads)."""

    seconds: float
    calls: int
    compiled: int
    loaded: int
    compile_seconds: float
    by_kernel: dict[str, int]

    def __str__(self) -> str:
        return (
            f"warm-up: {self.calls} calls in {self.seconds:.2f} s, {self.compiled} kernels "
            f"compiled, {self.loaded} loaded from Triton's cache"
        )


def run_warmup(
    calls: Sequence[Callable[[], object]],
    *,
    workers: int = 1,
    device: torch.device | str | None = None,
) -> WarmupReport:
    """Run every call once (``workers`` threads at a time), wait for the compiles they started
    on background threads (kernels compiled ahead, the tuned kernels a first call's stand-in
    served), and wait for the device.

    An exception in any call is raised after the others finished: a warm-up that fails says so
    rather than leaving the first real step to fail. Triton's interpreter keeps one global launch
    state, so under ``TRITON_INTERPRET=1`` the calls run one at a time.
    """
    if interpreter_enabled():
        workers = 1
    start = time.perf_counter()
    with counting_compiles() as count:
        if workers <= 1 or len(calls) <= 1:
            for call in calls:
                call()
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                futures = [pool.submit(call) for call in calls]
                for future in futures:
                    future.result()
        compile_ahead.wait_all()
        if device is not None and torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
    return WarmupReport(
        seconds=time.perf_counter() - start,
        calls=len(calls),
        compiled=count.compiled,
        loaded=count.loaded,
        compile_seconds=count.seconds,
        by_kernel=dict(count.by_kernel),
    )


__all__ = ["CompileCount", "WarmupReport", "counting_compiles", "run_warmup"]
