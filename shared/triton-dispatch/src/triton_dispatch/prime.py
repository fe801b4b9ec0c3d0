"""Triton's once-per-process start, begun on background threads when triton-dispatch is imported.

Before a process's first compile, or its first load of a kernel from Triton's disk cache, Triton
computes its own cache key (``triton.runtime.cache.triton_key``: a hash of the compiler's Python
sources and of the whole ``libtriton`` library, 0.4 s on an H200 host) and builds its CUDA driver
module with the host compiler (0.3 s with an empty cache; loaded from it afterwards). Neither
depends on any kernel, yet both sat on the path of the first call of an op: 0.4 of the 0.8 s a
first ResidualVQ step took with a warm disk cache. Importing triton-dispatch starts both on
daemon threads, so an op's first call, which usually follows loading a model and its data, finds
them done; a first call that comes sooner waits for them (:func:`wait`) instead of computing them
a second time beside them. ``hashlib`` and the host compiler's subprocess leave the
interpreter free meanwhile.

The threads never initialise CUDA (a process that forks workers after importing must not have):
whether a GPU is there is read from the NVIDIA driver's device files, the driver module is built
without selecting Triton's driver (which would ask torch whether CUDA is available), and
``ptxas`` is asked for its version (another subprocess of every first compile) only for a card
named in the driver's ``/proc`` files. Triton's modules are imported before the threads start.
Skipped under ``TRITON_INTERPRET=1`` (nothing is compiled), without an NVIDIA GPU, and with
``TRITON_DISPATCH_PRIME=0``.
"""

from __future__ import annotations

import glob
import os
import threading
import time

import torch

#: ``0`` leaves Triton's start to the first compile.
PRIME_ENV_VAR = "TRITON_DISPATCH_PRIME"

_lock = threading.Lock()
_threads: list[threading.Thread] = []
_pending = False  # threads started and not yet joined by a wait
_done: list[str] = []  # what the threads finished, for tests and benchmarks
_errors: list[str] = []  # what failed on them (the first compile then does that part itself)
_started = 0.0  # time.perf_counter() when the threads started
_spans: list[tuple[str, float, float]] = []  # (step, start, end) seconds after _started


def prime_enabled() -> bool:
    """Whether the background start runs: not interpreting, and ``TRITON_DISPATCH_PRIME`` not
    ``0``."""
    if os.environ.get("TRITON_INTERPRET", "0").strip() not in ("", "0"):
        return False
    value = os.environ.get(PRIME_ENV_VAR, "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def nvidia_gpu_present() -> bool:
    """Whether the NVIDIA driver shows a GPU, from its files alone (no CUDA call)."""
    return bool(glob.glob("/proc/driver/nvidia/gpus/*") or glob.glob("/dev/nvidia[0-9]*"))


def local_card_arch() -> int | None:
    """The compute capability (as Triton's ``arch``, 90 for 9.0) of the first GPU the driver's
    ``/proc`` files name, when :mod:`triton_dispatch.cards` knows its name; else ``None``."""
    from .cards import known_card

    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            with open(info) as f:
                model = next(
                    (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("Model:")), ""
                )
        except OSError:
            continue
        card = known_card(model) if model else None
        if card is not None:
            return card.capability[0] * 10 + card.capability[1]
    return None


def _step(name: str, work, *, record: bool = True) -> None:
    """Run ``work``; note ``name`` as finished (``record``) or its failure (the threads never
    raise: an internal that moved leaves that part to the first compile, as before)."""
    begin = time.perf_counter() - _started
    try:
        work()
    except Exception as error:
        _errors.append(f"{name}: {type(error).__name__}: {error}")
    else:
        if record:
            _done.append(name)
    if record:
        _spans.append((name, begin, time.perf_counter() - _started))


def _build_driver_module() -> None:
    from triton.backends.nvidia.driver import CudaUtils

    from .host_build import install_fast_host_builds

    install_fast_host_builds()  # the driver module is built the way launchers are
    CudaUtils()  # builds (or loads) it; Triton's driver, created later, finds it cached


def _cache_key_and_ptxas() -> None:
    from triton.runtime.cache import triton_key

    _step("triton_key", triton_key)
    arch = local_card_arch()
    if arch is not None:
        from triton.backends.nvidia.compiler import get_ptxas_version

        _step("ptxas", lambda: get_ptxas_version(arch))


def start() -> bool:
    """Start the background work once per process (a no-op later or when switched off); whether
    it runs. Two threads: the driver module, which a first launch needs before anything else
    and whose build is a host-compiler subprocess, beside the cache key and ``ptxas``'s
    version."""
    global _pending, _started
    with _lock:
        if _threads:
            return True
        if not prime_enabled() or not nvidia_gpu_present():
            return False
        # Triton's modules are imported here, before the threads start: a thread importing them
        # while this one imports a kernel package met half-initialised modules (circular
        # imports inside Triton). Every kernel package imports Triton at its own import anyway.
        import triton.backends.nvidia.compiler
        import triton.backends.nvidia.driver
        import triton.runtime.cache  # noqa: F401

        from . import cards, host_build  # noqa: F401

        _started = time.perf_counter()
        jobs = (
            ("driver", lambda: _step("driver", _build_driver_module)),
            ("key", lambda: _step("key", _cache_key_and_ptxas, record=False)),
        )
        for name, job in jobs:
            thread = threading.Thread(target=job, name=f"triton-dispatch-prime-{name}", daemon=True)
            _threads.append(thread)
            thread.start()
        _pending = True
        return True


def wait() -> None:
    """Block until the background start has finished (at once when it has, or never ran): called
    before a first compile, so that compile does not redo the same work beside it. A no-op while
    ``torch.compile`` traces the caller (thread calls do not trace; the traced op waits when it
    runs)."""
    global _pending
    if torch.compiler.is_compiling() or not _pending:
        return
    current = threading.current_thread()
    for thread in _threads:
        if thread.is_alive() and thread is not current:
            thread.join()
    if current not in _threads:
        _pending = False


def finished() -> tuple[str, ...]:
    """What the background start completed: ``"driver"``, ``"triton_key"``, ``"ptxas"`` (when
    the card is known), in the order they finished."""
    return tuple(_done)


def spans() -> tuple[tuple[str, float, float], ...]:
    """When each finished step ran: ``(step, start, end)`` in seconds after the threads started
    (for benchmarks that ask whether a first call waited on them, and why)."""
    return tuple(_spans)


def started_at() -> float | None:
    """``time.perf_counter()`` when the threads started, or ``None`` when they did not."""
    return _started if _threads else None


def errors() -> tuple[str, ...]:
    """What failed on the background threads (each then happens on the first compile)."""
    return tuple(_errors)
