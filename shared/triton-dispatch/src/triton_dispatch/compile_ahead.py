"""Compile kernels a step will launch later on background threads, beside the one compiling now.

On a new shape regime a training step launches kernels one after another (a forward, its
finishing pass, then the backward), and with an empty Triton cache each waits for its own compile.
The compiles do not depend on each other: Triton runs its passes in C++ and ``ptxas`` and the host
compiler in subprocesses, so they overlap on threads. An op that knows, when it builds a plan,
which launches come later (its backward, the second kernel of a two-kernel plan) hands them to
:meth:`KernelLaunch.compile_ahead <triton_dispatch.launch.KernelLaunch.compile_ahead>`; the later
launch then finds its kernel compiled, its C launcher built and its module loaded, or waits for the
compile already running instead of starting its own.

A guess that turns out wrong costs only the background work: the real launch still goes through
Triton with its real arguments. Failures in the background are dropped (the real launch raises
them). Off under the interpreter, on devices other than CUDA, while autotuning is switched on
(trials need real tensors), and with ``TRITON_DISPATCH_COMPILE_AHEAD=0``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

#: ``0`` compiles every kernel at its own first launch.
COMPILE_AHEAD_ENV_VAR = "TRITON_DISPATCH_COMPILE_AHEAD"

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pending: dict[int, list[Future]] = {}  # by id() of the JITFunction being compiled
_claimed: set[Hashable] = set()  # specialisations compiled or compiling in the background
_submitted = 0


def compile_ahead_enabled() -> bool:
    """Whether background compiles are on (``TRITON_DISPATCH_COMPILE_AHEAD`` is not ``0``)."""
    value = os.environ.get(COMPILE_AHEAD_ENV_VAR, "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def backward_follows(*tensors: object) -> bool:
    """Whether autograd will run a backward through a call on ``tensors``: grad mode is on and one
    of them requires a gradient (then the op's backward kernels are worth compiling ahead)."""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors
    )


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        workers = max(2, min(8, (os.cpu_count() or 2) - 1))
        _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="triton-dispatch-compile")
    return _pool


def submit(jit: object, job: Callable[[], object]) -> Future:
    """Run ``job`` (a compile of ``jit``) on the background pool; :func:`wait_for` ``jit`` waits."""
    global _submitted

    def run() -> object:
        try:
            return job()
        except Exception as error:  # the real launch compiles again and raises it
            return error

    with _lock:
        future = _executor().submit(run)
        _pending.setdefault(id(jit), []).append(future)
        _submitted += 1
    return future


def claim(key: Hashable) -> bool:
    """Whether ``key`` (a kernel's specialisation) is new to this process's background compiles:
    ``True`` once per key, for the caller that then compiles it."""
    with _lock:
        if key in _claimed:
            return False
        _claimed.add(key)
        return True


def wait_for(jit: object) -> None:
    """Block until every background compile of ``jit`` submitted so far has finished."""
    if not _pending:
        return
    with _lock:
        futures = _pending.pop(id(jit), None)
    for future in futures or ():
        future.result()


def wait_all() -> None:
    """Block until every background compile has finished (tests, and before timing)."""
    with _lock:
        futures = [f for fs in _pending.values() for f in fs]
        _pending.clear()
    for future in futures:
        future.result()


def submitted_count() -> int:
    """Background compiles submitted in this process."""
    return _submitted


__all__ = [
    "COMPILE_AHEAD_ENV_VAR",
    "backward_follows",
    "claim",
    "compile_ahead_enabled",
    "submit",
    "submitted_count",
    "wait_all",
    "wait_for",
]
