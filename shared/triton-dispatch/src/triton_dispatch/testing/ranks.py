"""Multi-process tests: run one function in N ranks of a ``torch.distributed`` process group and
compare what each rank returns with the single-process result.

``run_ranks(fn, 3, ...)`` spawns three processes (``gloo`` on CPU by default, ``nccl`` with one
GPU per rank), calls ``fn(rank, world_size, *args)`` in each inside an initialised process group
and returns the list of return values, rank by rank. A rank that raises ends the run at once: the
other ranks are stopped (they would otherwise wait in a collective for ever) and
:class:`RankFailed` names the rank and carries its traceback. A run that outlasts ``timeout`` is
stopped the same way.

``fn`` is looked up by module and name in each child. Functions of test files work too: the file
is loaded by path when its module cannot be imported (pytest's ``importlib`` mode).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

__all__ = ["RankFailed", "run_ranks"]

#: Seconds the other ranks get to finish on their own once one rank has failed.
_GRACE_S = 1.0


class RankFailed(RuntimeError):
    """A rank of :func:`run_ranks` raised, died or did not finish in time."""

    def __init__(self, message: str, rank: int | None = None, remote_traceback: str = "") -> None:
        super().__init__(
            message + (f"\n--- rank {rank} ---\n{remote_traceback}" if remote_traceback else "")
        )
        self.rank = rank
        self.remote_traceback = remote_traceback


def _resolve(module: str, qualname: str, file: str | None) -> Callable[..., Any]:
    try:
        obj: Any = importlib.import_module(module)
    except ImportError:
        if file is None:
            raise
        spec = importlib.util.spec_from_file_location(f"_ranks_{abs(hash(file))}", file)
        assert spec is not None and spec.loader is not None
        obj = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = obj
        spec.loader.exec_module(obj)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _child(
    rank: int,
    world_size: int,
    backend: str,
    workdir: str,
    target: tuple[str, str, str | None],
    args: tuple,
    collective_timeout: float,
    env: Mapping[str, str],
) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(env)
    out = os.path.join(workdir, f"rank{rank}")
    # The error is written before the process group goes down: tearing it down makes the other
    # ranks fail too, and the parent reports the rank whose error came first.
    try:
        fn = _resolve(*target)
        device_id = None
        if backend == "nccl":
            torch.cuda.set_device(rank)
            device_id = torch.device("cuda", rank)
        dist.init_process_group(
            backend,
            init_method=f"file://{os.path.join(workdir, 'store')}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=collective_timeout),
            device_id=device_id,
        )
        result = fn(rank, world_size, *args)
        torch.save(result, out + ".pt")
        code = 0
    except BaseException:
        with open(out + ".err", "w") as f:
            f.write(traceback.format_exc())
        code = 1
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass  # the result or the error is already on disk
    # Leave without the interpreter's finalisation: a communication thread still joinable when
    # C++ static objects are destroyed aborts the process ("terminate called without an active
    # exception") after the rank has finished its work.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _target(fn: Callable[..., Any]) -> tuple[str, str, str | None]:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if module is None or qualname is None or "<locals>" in qualname or "<lambda>" in qualname:
        raise TypeError(
            f"fn must be a module-level function (it is looked up by name in each rank), got {fn!r}"
        )
    file = getattr(sys.modules.get(module), "__file__", None)
    return module, qualname, file


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout: float = 120.0,
    collective_timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes that share a
    process group, and return each rank's return value (``torch.save``-able; move tensors to the
    CPU first for ``nccl``).

    Args:
        fn: a module-level function (test files included).
        world_size: number of ranks, at least 1.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (rank ``r`` on ``cuda:r``).
        timeout: seconds for the whole run before every rank is stopped.
        collective_timeout: the process group's timeout (default ``timeout``): a rank left waiting
            in a collective raises after this long even if the parent is gone.
        env: extra environment variables for the ranks.

    Raises:
        RankFailed: a rank raised (its traceback is in the message), died, or the run timed out.
    """
    import multiprocessing

    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    target = _target(fn)
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="run_ranks_") as workdir:
        common = (
            backend,
            workdir,
            target,
            args,
            float(collective_timeout or timeout),
            dict(env or {}),
        )
        procs = [
            ctx.Process(target=_child, args=(rank, world_size, *common), daemon=True)
            for rank in range(world_size)
        ]
        for p in procs:
            p.start()
        try:
            _wait(procs, workdir, timeout)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                p.join(5)
        return [_load(os.path.join(workdir, f"rank{rank}.pt")) for rank in range(world_size)]


def _wait(procs: list, workdir: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if failed:
            # Ranks stuck in a collective with the failed one never finish: give the rest a
            # moment to report their own errors, then stop them.
            until = time.monotonic() + _GRACE_S
            while time.monotonic() < until and any(p.is_alive() for p in procs):
                time.sleep(0.02)
            rank = _first_error(workdir, len(procs), failed)
            tb = _read(os.path.join(workdir, f"rank{rank}.err"))
            what = "raised" if tb else f"died with exit code {procs[rank].exitcode}"
            raise RankFailed(f"rank {rank} of {len(procs)} {what}", rank, tb)
        if all(p.exitcode == 0 for p in procs):
            return
        if time.monotonic() > deadline:
            running = [r for r, p in enumerate(procs) if p.is_alive()]
            raise RankFailed(f"timed out after {timeout:g} s; ranks still running: {running}")
        for p in procs:
            if p.is_alive():
                p.join(0.02)
                break


def _first_error(workdir: str, world_size: int, failed: list[int]) -> int:
    """The rank whose error came first (the others' are often consequences of it)."""
    errs = [
        (os.path.getmtime(path), r)
        for r in range(world_size)
        if os.path.exists(path := os.path.join(workdir, f"rank{r}.err"))
    ]
    return min(errs)[1] if errs else failed[0]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _load(path: str) -> Any:
    import torch

    return torch.load(path, weights_only=False)
