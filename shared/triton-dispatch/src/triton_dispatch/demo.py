"""The contract between a package's demo and the workspace's ``demo`` command.

A package registers ``run_demo(output_dir: pathlib.Path) -> DemoResult`` under the entry-point
group :data:`DEMO_ENTRY_POINT_GROUP`; the runner calls each one and prints one line per package.

Demos that time something on the host run it inside :func:`pinned_threads` and say how the time
was taken with :func:`timing_conditions`, so that a printed speed means the same on a busy machine
as on an idle one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

DEMO_ENTRY_POINT_GROUP = "triton_dispatch.demos"


@dataclass
class DemoResult:
    """What a demo reports.

    Attributes:
        summary: what ran, in a few words.
        backend: the backend that ran it (``"triton"``, ``"interpret"`` or ``"torch"``).
        key_figure: the one number a user should look at, with its unit.
        outputs: files the demo wrote.
    """

    summary: str
    backend: str
    key_figure: str
    outputs: list[Path] = field(default_factory=list)


@contextlib.contextmanager
def pinned_threads(
    device: torch.device | str = "cpu", threads: int | None = None
) -> Iterator[int | None]:
    """Run the block on ``threads`` PyTorch threads when ``device`` is the CPU, and restore the
    previous count after it.

    ``threads=None`` means 1, unless ``OMP_NUM_THREADS`` is set (then PyTorch's own choice, which
    follows it, is kept). Yields the count in use, or ``None`` on other devices, whose host
    threads are left alone.
    """
    bad = isinstance(threads, bool) or not isinstance(threads, (int, type(None)))
    if bad or (threads is not None and threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    if torch.device(device).type != "cpu":
        yield None
        return
    before = torch.get_num_threads()
    if threads is None:
        # Each intra-op thread wants a core of its own: on a machine shared with other work,
        # threads that wait for a busy core made the same demo 10-100x slower from run to run,
        # while one thread costs little at the demos' sizes. OMP_NUM_THREADS is a user's choice.
        threads = before if os.environ.get("OMP_NUM_THREADS") else 1
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)


def timing_conditions(device: torch.device | str, threads: int | None) -> str:
    """Where a time was taken, for the line that prints it: ``"1 thread, CPU"``,
    ``"4 threads, CPU"``, or the accelerator (``"CUDA, NVIDIA H100 80GB HBM3"``)."""
    device = torch.device(device)
    if device.type == "cpu":
        count = threads if threads is not None else torch.get_num_threads()
        return f"{count} thread{'' if count == 1 else 's'}, CPU"
    if device.type == "cuda" and torch.cuda.is_available():
        return f"CUDA, {torch.cuda.get_device_name(device)}"
    return device.type.upper()
