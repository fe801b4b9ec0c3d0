"""The CPU compile checks' worker: a child process that compiles described kernel launches for
NVIDIA targets with the interpreter off, one process per CPU core, and reports each one's shared
memory; :func:`run_compile_jobs` runs it from the checks.

    python -m triton_dispatch.compile_worker < jobs.json

A job is ``[module, kernel name, described arguments, compile options, capability, through]``
with the arguments as :func:`describe` writes them (``{parameter: [kind, value]}``, kinds ``ptr``,
``int``, ``bool``, ``float``, ``str``, ``none``) and ``through`` the last
stage to run: ``"cubin"`` (the whole compile, ``ptxas`` included) or ``"llir"``. The last line
printed is a JSON list with one ``{"shared": bytes}`` or ``{"error": message}`` per job, in order.
Run it with ``TRITON_INTERPRET=0`` and the kernels' modules importable (``PYTHONPATH``).

Shared memory is fixed once Triton's allocation passes have run, early in the LLVM-IR stage:
the lowering to LLVM that follows them, the LLVM ``-O3`` pipeline and the PTX and ``ptxas``
stages never change it, so a check of shared memory alone (``through="llir"``) stops right after
the allocation (measured: the same bytes as the whole compile for every first choice of the
workspace's packages on every target; tests/test_compile_jobs.py keeps checking it). Launches
that differ only where Triton does not specialise compile once.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import traceback
from typing import Any

import torch

#: ``(module, kernel name, described arguments, compile options, capability, through)``
Job = tuple[str, str, dict[str, list], dict[str, Any], int, str]

#: Triton's names of the tensor dtypes a described launch may hold.
DTYPE_NAMES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float64: "fp64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "i1",
    torch.float8_e4m3fn: "fp8e4nv",
    torch.float8_e5m2: "fp8e5",
}


def describe(value: Any) -> list | None:
    """``[kind, value]`` of one launch argument as the compile worker rebuilds it (``ptr`` with
    Triton's dtype name for a tensor; ``int``, ``bool``, ``float``, ``str``, ``none``), or
    ``None`` for a value a compile cannot reproduce (a tensor descriptor, an unknown dtype)."""
    if isinstance(value, torch.Tensor):
        return ["ptr", DTYPE_NAMES[value.dtype]] if value.dtype in DTYPE_NAMES else None
    if isinstance(value, bool):
        return ["bool", value]
    if isinstance(value, int):
        return ["int", value]
    if isinstance(value, float):
        return ["float", value]
    if isinstance(value, str):
        return ["str", value]
    if value is None:
        return ["none", None]
    return None  # a value the compile check cannot reproduce (the launch is then skipped)


def run_compile_jobs(jobs: list[tuple]) -> list[dict[str, Any]]:
    """Compile each job ``(module, name, described, options, capability, through)`` in a
    subprocess with the interpreter off (:mod:`triton_dispatch.compile_worker`, one process per
    core); returns ``{"shared": bytes}`` or ``{"error": message}`` per job, in order.
    ``RuntimeError`` when the subprocess itself fails or runs past its time (its processes are
    then killed)."""
    if not jobs:
        return []
    # the kernels' modules import in the subprocess as they did here (test folders included)
    path = os.pathsep.join(p for p in sys.path if p)
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=path)
    timeout = 300 + 10 * len(jobs)  # generous per compile, yet a hung one still ends
    # a session of its own: on a timeout the worker's pool processes go with it
    proc = subprocess.Popen(
        [sys.executable, "-m", "triton_dispatch.compile_worker"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(json.dumps([list(job) for job in jobs]), timeout=timeout)
    except subprocess.TimeoutExpired as timed_out:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        message = f"the compile check took over {timeout} s ({len(jobs)} compiles)"
        raise RuntimeError(message) from timed_out
    if proc.returncode != 0:
        raise RuntimeError(f"the compile check itself failed:\n{stderr[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def _jit_function(module: str, name: str):
    from triton.runtime.jit import JITFunction

    fn = getattr(importlib.import_module(module), name)
    while not isinstance(fn, JITFunction):
        fn = fn.fn
    return fn


def _shared_through_llir(src, target, options: dict[str, Any]) -> int:
    """The shared memory of ``src`` after Triton's stages up to its allocation passes, without
    its cache: Triton 3.6's internals, so a failure here falls back to the whole compile."""
    from triton._C.libtriton import ir
    from triton.compiler.compiler import make_backend

    backend = make_backend(target)
    parsed = backend.parse_options(dict(options, **src.parse_options()))
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    codegen = backend.get_codegen_implementation(parsed)
    module = src.make_ir(target, parsed, codegen, backend.get_module_map(), context)
    stages: dict[str, Any] = {}
    backend.add_stages(stages, parsed, src.language)
    metadata: dict[str, Any] = {"target": target, **parsed.__dict__}
    for stage in ("ttir", "ttgir"):
        module = stages[stage](module, metadata)
    return _shared_once_allocated(stages["llir"], module, metadata)


class _Allocated(Exception):
    """Raised out of the LLVM-IR stage once its allocation passes have run."""


def _shared_once_allocated(make_llir, module, metadata: dict[str, Any]) -> int:
    """The ``ttg.shared`` the LLVM-IR stage's own allocation passes give ``module``: the stage is
    run with the lowering to LLVM replaced by a stop, so the passes before it (shared, tensor
    and scratch memory allocation, in the order this Triton adds them) run and the lowering,
    about half the stage, does not."""
    from triton._C.libtriton import nvidia

    lowering = nvidia.passes.ttgpuir.add_to_llvmir

    def stop(pm, *args, **kwargs):
        pm.run(module, "make_llir")
        raise _Allocated

    nvidia.passes.ttgpuir.add_to_llvmir = stop
    try:
        make_llir(module, metadata)
    except _Allocated:
        return int(module.get_int_attr("ttg.shared"))
    finally:
        nvidia.passes.ttgpuir.add_to_llvmir = lowering
    raise AttributeError("the LLVM-IR stage never lowered to LLVM")  # the whole compile instead


def _source_parts(fn, described: dict[str, list]) -> tuple[dict, dict, dict]:
    """``(signature, constexprs, attrs)`` of an ``ASTSource`` for ``described``: what Triton
    specialises a launch on (an integer argument only by its width and by whether it divides
    by 16), so two launches with equal parts compile to the same kernel."""
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(fn.params):
        kind, value = described[param.name]
        if param.is_constexpr or kind in ("none", "str"):
            signature[param.name] = "constexpr"
            constexprs[param.name] = value
        elif kind == "ptr":
            signature[param.name] = "*" + value
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif kind in ("int", "bool"):
            value = int(value)
            signature[param.name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0 and value and param.name not in fn.do_not_specialize:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[param.name] = "fp32"
    return signature, constexprs, attrs


def compile_job(job: Job) -> dict[str, Any]:
    """Compile one job for ``sm_<capability>`` (``sm_90a``, ``sm_100a``, ``sm_120a`` from 9.0 on,
    what Triton 3.6 targets); ``{"shared": bytes}``, or ``{"error": message}`` when it fails."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name, described, options, capability, through = job
    constexprs: dict[str, Any] = {}
    try:
        fn = _jit_function(module, name)
        signature, constexprs, attrs = _source_parts(fn, described)
        src = ASTSource(fn, signature, constexprs, attrs)
        target = GPUTarget("cuda", capability, 32)
        if through == "llir":
            try:
                return {"shared": _shared_through_llir(src, target, options)}
            except (AttributeError, ImportError, KeyError, TypeError):
                pass  # another Triton's internals: the whole compile below
        compiled = triton.compile(src, target=target, options=options)
    except Exception:
        where = f"{module}.{name} on sm_{capability} {constexprs} {options}"
        return {"error": f"{where}:\n{traceback.format_exc()[-3000:]}"}
    return {"shared": int(compiled.metadata.shared)}


def _compiled_identity(job: Job) -> str | None:
    """What the compile of ``job`` depends on (see :func:`_source_parts`), or ``None`` when
    that cannot be worked out (the job's own compile then reports why)."""
    module, name, described, options, capability, through = job
    try:
        signature, constexprs, attrs = _source_parts(_jit_function(module, name), described)
        parts = [module, name, signature, constexprs, sorted(attrs.items()), options]
        return json.dumps([*parts, capability, through], sort_keys=True)
    except Exception:
        return None


def compile_jobs(jobs: list[Job]) -> list[dict[str, Any]]:
    """Every job's result, in order. Jobs that differ only where Triton does not specialise
    (integer sizes of one width and divisibility) compile once. Each compile is one CPU's work
    (the LLVM passes and ``ptxas``), so the jobs run in one forked process per core."""
    identities = [_compiled_identity(job) or f"job {i}" for i, job in enumerate(jobs)]
    first: dict[str, Job] = {}
    for identity, job in zip(identities, jobs):
        first.setdefault(identity, job)
    unique = list(first.values())
    workers = min(len(unique), os.cpu_count() or 1)
    if workers <= 1:
        results = [compile_job(job) for job in unique]
    else:
        context = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            results = list(pool.map(compile_job, unique))
    by_identity = dict(zip(first, results))
    return [by_identity[identity] for identity in identities]


def main() -> None:
    jobs = [tuple(job) for job in json.loads(sys.stdin.read())]
    print(json.dumps(compile_jobs(jobs)))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
