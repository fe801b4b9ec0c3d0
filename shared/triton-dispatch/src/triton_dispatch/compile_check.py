"""Compile the kernels a CPU test run launched for a real GPU target, without a GPU.

The Triton interpreter runs kernels as NumPy code and accepts programs the GPU compiler rejects (a
variable that takes two shapes in the two branches of a runtime ``if``, an unsupported dtype
cast, ...). :func:`recorded_launches` notes every interpreted launch (kernel, argument dtypes,
integer and constexpr values); :func:`compile_recorded` then compiles each distinct launch for an
NVIDIA target in a subprocess with the interpreter off, so a CPU-only machine catches those errors.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

__all__ = [
    "check_table_configs",
    "compile_recorded",
    "config_variants",
    "launcher_facts",
    "nvidia_backend_available",
    "recorded_launches",
    "unavailable_reason",
]

_DTYPES = {
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
}


def _describe(value: Any) -> list | None:
    if isinstance(value, torch.Tensor):
        return ["ptr", _DTYPES.get(value.dtype)]
    if isinstance(value, bool):
        return ["bool", value]
    if isinstance(value, int):
        return ["int", value]
    if isinstance(value, float):
        return ["float", value]
    if value is None:
        return ["none", None]
    return None  # a value the compile check cannot reproduce (the launch is then skipped)


@contextlib.contextmanager
def recorded_launches() -> Iterator[list[tuple[str, str, dict[str, list | None]]]]:
    """Inside the block, every kernel launch under ``TRITON_INTERPRET=1`` is appended to the
    yielded list as ``(module, kernel name, {parameter: description})``."""
    from triton.runtime.interpreter import InterpretedFunction

    calls: list[tuple[str, str, dict[str, list | None]]] = []
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        bound = {**dict(zip(self.arg_names, args)), **kwargs}
        described = {n: _describe(bound[n]) for n in self.arg_names if n in bound}
        calls.append((self.fn.__module__, self.fn.__name__, described))
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    try:
        yield calls
    finally:
        InterpretedFunction.run = original


def nvidia_backend_available() -> bool:
    """Whether Triton's NVIDIA compiler backend is installed (it is on Linux x86-64 wheels)."""
    return importlib.util.find_spec("triton.backends.nvidia") is not None


def unavailable_reason() -> str | None:
    """Why a compile check cannot run here (``None`` when it can): it records interpreted
    launches, so the interpreter must be on, and it needs Triton's NVIDIA backend."""
    from .backend import interpreter_enabled

    if not interpreter_enabled():
        return "records launches under the Triton interpreter (TRITON_INTERPRET=1)"
    if not nvidia_backend_available():
        return "Triton's NVIDIA backend is not installed"
    return None


_SCRIPT = r"""
import concurrent.futures, importlib, json, multiprocessing, os, sys, traceback
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction


def compile_call(call):
    module, name, described, options = call
    fn = getattr(importlib.import_module(module), name)
    while not isinstance(fn, JITFunction):
        fn = fn.fn
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(fn.params):
        kind, value = described[param.name]
        if param.is_constexpr or kind == "none":
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
    try:
        triton.compile(
            ASTSource(fn, signature, constexprs, attrs),
            target=GPUTarget("cuda", capability, 32),
            options=options,
        )
    except Exception:
        return f"{module}.{name} {constexprs} {options}:\n{traceback.format_exc()[-3000:]}"
    return None


calls, capability = json.loads(sys.stdin.read())
# each compile is one CPU's work (the LLVM and ptxas passes): one process per core
workers = min(len(calls), os.cpu_count() or 1)
if workers > 1:
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        results = list(pool.map(compile_call, calls))
else:
    results = [compile_call(call) for call in calls]
failures = [r for r in results if r is not None]
print(json.dumps(failures))
"""


def compile_recorded(calls: list[tuple], *, capability: int = 90) -> list[str]:
    """Compile every distinct recorded launch for ``sm_<capability>``; returns one message per
    launch that failed to compile (empty when all compiled). A launch is ``(module, name,
    described)`` as recorded, or with a fourth item, the compile options (``num_warps``, ...)."""
    unique: dict[str, tuple] = {}
    for module, name, described, *rest in calls:
        if any(d is None for d in described.values()):
            continue
        options = rest[0] if rest else {}
        entry = (module, name, described, options)
        unique[json.dumps(entry, sort_keys=True)] = entry
    if not unique:
        return []
    # the kernels' modules import in the subprocess as they did here (test folders included)
    path = os.pathsep.join(p for p in sys.path if p)
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=path)
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        input=json.dumps([list(unique.values()), capability]),
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        return [f"the compile check itself failed:\n{proc.stderr[-3000:]}"]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_LAUNCHER_SCRIPT = r"""
import inspect, json, re, sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia import driver
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction


@triton.jit
def probe(X, Y, n, scale, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i, mask=i < n) * scale, mask=i < n)


def call_arguments(source, callee):
    # the arguments of the first call of callee in source, whitespace removed
    start = source.index(callee + "(") + len(callee) + 1
    depth, end = 1, start
    while depth:
        depth += {"(": 1, ")": -1}.get(source[end], 0)
        end += 1
    return ["".join(a.split()) for a in source[start : end - 1].split(",")]


src = ASTSource(probe, {"X": "*fp32", "Y": "*fp32", "n": "i32", "scale": "fp32",
                        "BLOCK": "constexpr"}, {"BLOCK": 64}, {})
kernel = triton.compile(src, target=GPUTarget("cuda", int(sys.argv[1]), 32))
md = kernel.metadata
# the launcher's source as CudaLauncher.__init__ generates it for this kernel
arg_idx = lambda x: (src.fn.arg_names.index(x),) if isinstance(x, str) else x
constants = {arg_idx(k): v for k, v in src.constants.items()}
c_source = driver.make_launcher(constants, dict(src.signature), getattr(md, "tensordesc_meta", None))
parse = re.search(r'PyArg_ParseTuple\(args,\s*"([^"]*)"\s*,(.*?)\)\)\s*\{', c_source, re.S)
print(json.dumps({
    "version": triton.__version__,
    "c_launch_parameters": re.findall(r"&(\w+)", parse.group(2)),
    "c_launch_format": parse.group(1),
    "packed_metadata": list(kernel.packed_metadata),
    "num_warps_ctas_shared": [md.num_warps, md.num_ctas, md.shared],
    "scratch_and_flags": {n: getattr(md, n, "missing") for n in ("global_scratch_size",
        "profile_scratch_size", "launch_cooperative_grid", "launch_pdl")},
    "launcher_call": call_arguments(inspect.getsource(driver.CudaLauncher.__call__),
                                    "self.launch"),
    "jit_run_call": call_arguments(inspect.getsource(JITFunction.run), "kernel.run"),
    "kernel_arguments": list(src.fn.arg_names),
}))
"""


def launcher_facts(*, capability: int = 90) -> dict[str, Any]:
    """What the installed Triton's CUDA launch path looks like, read on a machine without a GPU:
    a four-argument probe kernel (two pointers, an int, a float, one constexpr) is compiled for
    ``sm_<capability>`` in a subprocess, and the launcher Triton would build for it is generated
    (not compiled). Returns ``c_launch_parameters`` (the C ``launch`` function's parameters in
    order, as its source names them), ``packed_metadata`` and ``num_warps_ctas_shared`` (what
    the launcher unpacks it into), ``scratch_and_flags`` (metadata the launcher reads),
    ``launcher_call`` (the arguments ``CudaLauncher.__call__`` passes to the C function) and
    ``jit_run_call`` (those ``JITFunction.run`` passes to ``CompiledKernel.run``), for tests that
    pin :class:`~triton_dispatch.launch.KernelLaunch`'s direct launches to them."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "launcher_facts_probe.py")
        with open(script, "w") as f:
            f.write(_LAUNCHER_SCRIPT)
        proc = subprocess.run(
            [sys.executable, script, str(capability)],
            env=dict(os.environ, TRITON_INTERPRET="0"),
            capture_output=True,
            text=True,
            timeout=600,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"reading the launcher failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def config_variants(
    calls: list[tuple[str, str, dict[str, list | None]]], configs_of: dict[str, list]
) -> list[tuple]:
    """One launch per kernel and config: the first recorded launch of each kernel named in
    ``configs_of`` (``{kernel name: [triton.Config, ...]}``) with its constexprs and compile
    options replaced by each config's (the GPU's block sizes instead of the interpreter's)."""
    variants = []
    seen: set[str] = set()
    first = {}
    for module, name, described in calls:
        first.setdefault(name, (module, name, described))
    for module, name, described in first.values():
        for config in configs_of.get(name, ()):
            values = {**described}
            for k, v in config.kwargs.items():
                values[k] = ["bool", v] if isinstance(v, bool) else ["int", v]
            options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
            if getattr(config, "maxnreg", None) is not None:
                options["maxnreg"] = config.maxnreg
            key = json.dumps([module, name, values, options], sort_keys=True)
            if key not in seen:
                seen.add(key)
                variants.append((module, name, values, options))
    return variants


def check_table_configs(
    package: str,
    warm: Callable[[], object],
    *,
    skip: Mapping[str, str] | None = None,
    capability: int = 90,
) -> list[str]:
    """Compile, for ``sm_<capability>``, every config a GPU would launch for ``package``'s tuned
    kernels (each config of its shipped tables and its heuristic's default), with the arguments
    of a launch recorded while ``warm()`` runs under the interpreter. Returns the failures, and
    names each tuned kernel that ``warm()`` never launched (its configs went unchecked) unless
    ``skip`` gives the reason it cannot be launched here (``{kernel name: why}``)."""
    from .launch_configs import table_configs

    configs = {k: v for k, v in table_configs(package).items() if k not in (skip or {})}
    with recorded_launches() as calls:
        warm()
    variants = config_variants(calls, configs)
    launched = {name for _, name, _, _ in variants}
    missing = [f"{name}: not launched by the warm-up" for name in sorted(set(configs) - launched)]
    return missing + compile_recorded(variants, capability=capability)
