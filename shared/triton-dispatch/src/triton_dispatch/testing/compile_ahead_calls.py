"""Record the launches an op hands to ``KernelLaunch.compile_ahead``, for CPU tests: off the GPU
nothing compiles, but each call still checks its argument count, and a test can see which
launches a plan chose to compile ahead."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..launch import KernelLaunch


@contextlib.contextmanager
def recorded_compile_aheads() -> Iterator[list[tuple[list[str], int]]]:
    """Inside the block, every ``KernelLaunch.compile_ahead`` call is appended to the yielded list
    as ``(the launch's per-call parameter names, the number of arguments passed)``."""
    calls: list[tuple[list[str], int]] = []
    original = KernelLaunch.compile_ahead

    def record(self, *args):
        calls.append((list(self.free), len(args)))
        return original(self, *args)

    KernelLaunch.compile_ahead = record
    try:
        yield calls
    finally:
        KernelLaunch.compile_ahead = original
