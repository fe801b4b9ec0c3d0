"""Compile the kernels a CPU test run launched for a real GPU target, without a GPU.

The Triton interpreter runs kernels as NumPy code and accepts programs the GPU compiler rejects (a
variable that takes two shapes in the two branches of a runtime ``if``, an unsupported dtype
cast, ...). :func:`recorded_launches` notes every interpreted launch (kernel, argument dtypes,
integer and constexpr values, compile options); :func:`compile_recorded` then compiles each
distinct launch for an NVIDIA target in a subprocess with the interpreter off, so a CPU-only
machine catches those errors, and checks that its shared memory fits every supported GPU
(:mod:`triton_dispatch.gpu_targets`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .compile_worker import describe, run_compile_jobs

if TYPE_CHECKING:
    from .gpu_targets import GpuTarget

__all__ = [
    "COMPILE_OPTIONS",
    "RecordedLaunch",
    "compile_recorded",
    "launcher_facts",
    "nvidia_backend_available",
    "recorded_launches",
    "unavailable_reason",
]

#: Launch keywords that are compile options (what ``triton.compile`` takes besides the source).
COMPILE_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion",
                   "launch_cooperative_grid", "launch_pdl")  # fmt: skip


class RecordedLaunch(tuple):
    """One interpreted launch as ``(module, kernel name, {parameter: description})``, with the
    compile options it was launched with in :attr:`options` (``num_warps``, ``num_stages``, ...),
    so that a GPU compile of it uses the same ones."""

    options: dict[str, Any]

    def __new__(cls, module: str, name: str, described: dict, options: dict[str, Any]):
        launch = super().__new__(cls, (module, name, described))
        launch.options = options
        return launch


@contextlib.contextmanager
def recorded_launches(*, run: bool = True) -> Iterator[list[RecordedLaunch]]:
    """Inside the block, every kernel launch under ``TRITON_INTERPRET=1`` is appended to the
    yielded list as a :class:`RecordedLaunch` ``(module, kernel name, {parameter:
    description})``. With ``run=False`` the launches are recorded, not run (their outputs stay
    unwritten): for a check that only compiles what a plan launches, at sizes the interpreter
    would take long over."""
    from triton.runtime.interpreter import InterpretedFunction

    calls: list[RecordedLaunch] = []
    original = InterpretedFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        bound = {**dict(zip(self.arg_names, args)), **kwargs}
        described = {n: describe(bound[n]) for n in self.arg_names if n in bound}
        options = {n: kwargs[n] for n in COMPILE_OPTIONS if kwargs.get(n) is not None}
        calls.append(RecordedLaunch(self.fn.__module__, self.fn.__name__, described, options))
        if run:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        return None

    InterpretedFunction.run = record
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


def compile_recorded(
    calls: list[tuple], *, capability: int = 90, targets: Sequence[GpuTarget] | None = None
) -> list[str]:
    """Compile every distinct recorded launch for ``sm_<capability>`` (the whole compile, so
    ``ptxas`` errors show), and check that its shared memory fits each of ``targets`` it can run
    on (default: every supported GPU, :data:`~triton_dispatch.gpu_targets.TARGETS`; those
    compiles stop at LLVM IR and are shared by ``mma`` group). Returns one message per launch
    that failed to compile or does not fit a target (empty when all is well).

    A launch is ``(module, name, described)`` as recorded (its compile options from
    :attr:`RecordedLaunch.options`), or with a fourth item, the compile options."""
    from .gpu_targets import TARGETS, GpuTarget, collect_uses, plan_fit_jobs, plan_jobs, target_of

    unique: dict[str, tuple] = {}
    for call in calls:
        module, name, described, *rest = call
        if any(d is None for d in described.values()):
            continue
        options = rest[0] if rest else getattr(call, "options", {})
        entry = (module, name, described, dict(options))
        unique[json.dumps(entry, sort_keys=True)] = entry
    compiled = target_of(divmod(capability, 10)) or GpuTarget(capability, 0, "", "", 0)
    jobs: dict[str, tuple] = {}
    launches = list(unique.values())
    fit = plan_fit_jobs({t: launches for t in (TARGETS if targets is None else targets)}, jobs)
    whole = plan_jobs(launches, [compiled], jobs, through="cubin")
    try:
        results = dict(zip(jobs, run_compile_jobs(list(jobs.values()))))
    except RuntimeError as exc:
        return [str(exc)]
    failures = [u.error for u in collect_uses(whole, jobs, results) if u.error is not None]
    # a launch whose whole compile failed is reported once, not again per target
    failed = {json.dumps(e, sort_keys=True) for e, _, k in whole if "error" in results[k]}
    for (entry, _, _), use in zip(fit, collect_uses(fit, jobs, results)):
        if not use.fits and not (use.error and json.dumps(entry, sort_keys=True) in failed):
            failures.append(str(use))
    return failures


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
