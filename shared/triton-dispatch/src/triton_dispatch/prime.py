"""Triton's once-per-process start, begun on a background thread when triton-dispatch is imported.

Before a process's first compile, or its first load of a kernel from Triton's disk cache, Triton
computes its own cache key (``triton.runtime.cache.triton_key``: a hash of the compiler's Python
sources and of the whole ``libtriton`` library, 0.4 s on an H200 host) and builds its CUDA driver
module with the host compiler (0.3 s with an empty cache; loaded from it afterwards). Neither
depends on any kernel, yet both sat on the path of the first call of an op: 0.4 of the 0.8 s a
first ResidualVQ step took with a warm disk cache. Importing triton-dispatch starts both on a
daemon thread, so an op's first call, which usually follows loading a model and its data, finds
them done; a first call that comes sooner waits for the thread (:func:`wait`) instead of
computing them a second time beside it. ``hashlib`` and the host compiler's subprocess leave the
interpreter free meanwhile.

The thread never initialises CUDA (a process that forks workers after importing must not have):
it looks for the NVIDIA driver's device files to decide whether a GPU is there, builds the driver
module without selecting Triton's driver (which would ask torch whether CUDA is available), and
asks ``ptxas`` for its version (another subprocess of every first compile) only for a card it
can name from the driver's ``/proc`` files. Skipped under ``TRITON_INTERPRET=1`` (nothing is
compiled), without an NVIDIA driver, and with ``TRITON_DISPATCH_PRIME=0``.
"""

from __future__ import annotations

import glob
import os
import threading

#: ``0`` leaves Triton's start to the first compile.
PRIME_ENV_VAR = "TRITON_DISPATCH_PRIME"

_lock = threading.Lock()
_thread: threading.Thread | None = None
_done: list[str] = []  # what the thread finished, for tests and benchmarks


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


def _prime() -> None:
    try:
        if not nvidia_gpu_present():
            return
        from triton.runtime.cache import triton_key

        triton_key()
        _done.append("triton_key")
        arch = local_card_arch()
        if arch is not None:
            from triton.backends.nvidia.compiler import get_ptxas_version

            get_ptxas_version(arch)
            _done.append("ptxas")
        from triton.backends.nvidia.driver import CudaUtils

        from .host_build import install_fast_host_builds

        install_fast_host_builds()  # the driver module is built the way launchers are
        CudaUtils()  # builds (or loads) it; Triton's driver, created later, finds it cached
        _done.append("driver")
    except Exception:  # an internal that moved: the first compile does the work as before
        return


def start() -> bool:
    """Start the background thread once per process (a no-op later or when switched off);
    whether it runs."""
    global _thread
    with _lock:
        if _thread is not None:
            return True
        if not prime_enabled():
            return False
        _thread = threading.Thread(target=_prime, name="triton-dispatch-prime", daemon=True)
        _thread.start()
        return True


def wait() -> None:
    """Block until the background start has finished (at once when it has, or never ran): called
    before a first compile, so that compile does not redo the same work beside it."""
    thread = _thread
    if thread is not None and thread.is_alive() and thread is not threading.current_thread():
        thread.join()


def finished() -> tuple[str, ...]:
    """What the background start completed, in order: ``"triton_key"``, ``"ptxas"`` (when the card
    is known), ``"driver"``."""
    return tuple(_done)
