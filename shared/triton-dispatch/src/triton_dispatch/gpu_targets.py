"""The GPUs the packages support, with the shared memory one program may use on each, and a
compile of kernel launches for them on a machine without a GPU that reports whether each fits.

A config tuned on an H100 (227 KB of shared memory per block) can need more than a smaller card
has: Triton then refuses the launch with ``OutOfResources`` (seen on an RTX 5090, vLLM PR #43047).
:func:`compile_for_targets` compiles launches for each target's architecture on the CPU and reads
the shared memory Triton allocated (the compiled kernel's ``metadata.shared``, what Triton compares
with the device's limit at launch). Triton 3.6 compiles every target here: ``sm_80``-``sm_89``
with its bundled ``ptxas`` (CUDA 12.8), ``sm_90a``, ``sm_100a`` and ``sm_120a`` (it adds the ``a``
from 9.0 on) with ``ptxas`` and ``ptxas-blackwell`` (CUDA 12.9).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .device import DeviceFacts

__all__ = [
    "TARGETS",
    "GpuTarget",
    "SharedMemoryUse",
    "check_launches",
    "collect_uses",
    "compile_for_targets",
    "describe_launch",
    "plan_fit_jobs",
    "plan_jobs",
    "runs_on",
    "target_of",
]


@dataclass(frozen=True)
class GpuTarget:
    """One supported GPU architecture.

    Attributes:
        capability: the compute capability as Triton's ``GPUTarget`` takes it (``90`` for 9.0).
        shared_memory_per_block: the most shared memory one program may use, in bytes (the
            opt-in limit: what ``shared_memory_per_block_optin`` and Triton's ``max_shared_mem``
            report on such a card).
        mma: the tensor-core instructions Triton 3.6 lowers ``tl.dot`` to there (``mma.sync``,
            Hopper's ``wgmma``, Blackwell's ``tcgen05``). Targets of one ``mma`` get the same
            shared-memory layouts (see :data:`TARGETS`).
        cards: the cards it stands for.
        sm_count: streaming multiprocessors of its usual card (for a simulated device).
    """

    capability: int
    shared_memory_per_block: int
    mma: str
    cards: str
    sm_count: int

    @property
    def name(self) -> str:
        """``"sm_90"``."""
        return f"sm_{self.capability}"

    @property
    def compute_capability(self) -> tuple[int, int]:
        """``(9, 0)``, as ``torch.cuda.get_device_capability`` gives it."""
        return divmod(self.capability, 10)

    @property
    def has_fp8_dot(self) -> bool:
        """Whether ``tl.dot`` takes float8 operands here (compute capability 8.9 and up)."""
        return self.capability >= 89

    def facts(self) -> DeviceFacts:
        """What a card of this target reports, for
        :func:`~triton_dispatch.device.simulated_device`."""
        return DeviceFacts(
            name=f"{self.cards.split(',')[0]} (simulated {self.name})",
            capability=self.compute_capability,
            sm_count=self.sm_count,
            shared_memory_per_block=self.shared_memory_per_block,
            total_memory=0,
        )


_KB = 1024

#: The supported targets. Shared memory per block, opt-in limit (CUDA C Programming Guide,
#: "Technical Specifications per Compute Capability"; the figures noted for this workspace
#: agree): H100/H200 (sm_90) and B200 (sm_100) ~227 KB; A100 (sm_80) 164 KB per SM, of which 163
#: KB per block; sm_86 and RTX 4090 (sm_89) ~100 KB per SM, 99 KB per block; RTX 5090 / RTX PRO
#: 6000 (sm_120) ~99 KB. Configs tuned on an H100 fail with OutOfResources on a 5090 (vLLM PR
#: #43047).
#:
#: ``mma`` groups targets whose compiles allocate the same shared memory. Measured with Triton
#: 3.6 on every config the packages' tuned kernels may launch for every regime of their tables
#: (first choices and fallbacks: whole compiles for vq-kernels' 636 and tomo-kplanes' 1782, up
#: to LLVM IR for late-interaction-kernels' 4576) and every snake_conv decoder launch: sm_80,
#: sm_86, sm_89 and sm_120 always agreed to the byte; sm_90 (wgmma keeps an operand buffer per pipeline stage where mma.sync
#: keeps one fewer) and sm_100 (tcgen05: barriers, tensor memory) differ from them and from
#: each other. The exhaustive target test compiles every target and
#: fails if a group ever disagrees.
TARGETS: tuple[GpuTarget, ...] = (
    GpuTarget(80, 163 * _KB, "mma.sync", "A100", 108),
    GpuTarget(86, 99 * _KB, "mma.sync", "RTX 3090, A6000, A10, A40", 82),
    GpuTarget(89, 99 * _KB, "mma.sync", "RTX 4090, L4, L40S", 128),
    GpuTarget(90, 227 * _KB, "wgmma", "H100, H200", 132),
    GpuTarget(100, 227 * _KB, "tcgen05", "B200", 148),
    GpuTarget(120, 99 * _KB, "mma.sync", "RTX 5090, RTX PRO 6000", 170),
)


def target_of(capability: tuple[int, int]) -> GpuTarget | None:
    """The supported target of a compute capability (``(12, 0)`` → sm_120), or ``None``."""
    wanted = capability[0] * 10 + capability[1]
    return next((t for t in TARGETS if t.capability == wanted), None)


def runs_on(described: Mapping[str, Any], target: GpuTarget) -> bool:
    """Whether a launch (:func:`describe_launch`'s arguments) can run on ``target`` at all: float8
    operands need a float8 ``tl.dot`` (the ops that take them refuse older GPUs)."""
    fp8 = any(kind == "ptr" and str(v).startswith("fp8") for kind, v in described.values())
    return target.has_fp8_dot or not fp8


@dataclass(frozen=True)
class SharedMemoryUse:
    """What one launch compiled for one target needs.

    Attributes:
        module, kernel: where the kernel is defined and its name.
        target: the target it is for.
        described: the launch's arguments as the compile took them (``{name: [kind, value]}``).
        options: its compile options (``num_warps``, ``num_stages``, ...).
        shared: bytes of shared memory per program (``None`` when the compile failed).
        error: the compile's error (``None`` when it compiled).
        measured_on: the target it was compiled for: ``target`` itself, or another of the same
            :attr:`GpuTarget.mma` when the compiles were shared.
    """

    module: str
    kernel: str
    target: GpuTarget
    described: Mapping[str, Any]
    options: Mapping[str, Any]
    shared: int | None
    error: str | None = None
    measured_on: GpuTarget | None = None

    @property
    def fits(self) -> bool:
        """Whether it compiled and its shared memory is within the target's limit."""
        return self.shared is not None and self.shared <= self.target.shared_memory_per_block

    def __str__(self) -> str:
        constexprs = {n: v for n, (kind, v) in self.described.items() if kind != "ptr"}
        dtypes = sorted({v for kind, v in self.described.values() if kind == "ptr"})
        what = f"{self.kernel} {constexprs} {dtypes} {dict(self.options)} on {self.target.name}"
        if self.error is not None:
            return f"{what}: did not compile:\n{self.error}"
        limit = self.target.shared_memory_per_block
        verdict = "fits" if self.fits else "does NOT fit"
        return f"{what}: {self.shared} bytes of shared memory, {verdict} ({limit} per block)"


def describe_launch(kernel, args: Mapping[str, Any]) -> tuple[str, str, dict[str, list]]:
    """``(module, name, described)`` of a launch of ``kernel`` (a ``@triton.jit`` function, or one
    wrapped by an autotuner) with ``args`` by parameter name: a tensor or a ``torch.dtype`` for a
    pointer, ints, bools, floats, strings, ``None``. ``ValueError`` names a parameter left out
    or a value a compile cannot take."""
    import torch

    from .compile_worker import describe

    jit = kernel  # the JIT (or interpreted) function inside autotuner and heuristics wrappers
    while not hasattr(jit, "arg_names") or hasattr(jit, "configs") or hasattr(jit, "values"):
        jit = jit.fn
    fn = jit.fn  # the Python function: its module and name are where the compile finds it
    missing = [n for n in jit.arg_names if n not in args]
    if missing:
        raise ValueError(f"{fn.__name__}: no value for {missing}")
    described = {}
    for name in jit.arg_names:
        value = args[name]
        if isinstance(value, torch.dtype):
            value = torch.empty(0, dtype=value)
        described[name] = describe(value)
        if described[name] is None:
            raise ValueError(f"{fn.__name__}: cannot compile {name}={value!r}")
    return fn.__module__, fn.__name__, described


Job = tuple  # (module, name, described, options, capability, through): a compile_worker job
Wanted = tuple  # ((module, name, described, options), target, job key)


def plan_jobs(
    launches: Iterable[tuple],
    targets: Sequence[GpuTarget],
    jobs: dict[str, Job],
    *,
    through: Literal["cubin", "llir"] = "cubin",
    share_by_mma: bool = False,
) -> list[Wanted]:
    """The compile jobs of :func:`compile_for_targets`, added to ``jobs`` (by key: one per launch
    and measured target; a whole compile replaces a shorter one of the same key); returns what
    each target will read."""
    wanted: list[Wanted] = []
    seen: set[str] = set()
    for launch in launches:
        module, name, described, *rest = launch
        options = dict(rest[0] if rest else getattr(launch, "options", {}))
        entry = (module, name, dict(described), options)
        ident = json.dumps(entry, sort_keys=True)
        if ident in seen:
            continue
        seen.add(ident)
        for target in targets:
            if not runs_on(described, target):
                continue
            measured = target
            if share_by_mma:  # the group's first target this launch runs on
                group = [t for t in targets if t.mma == target.mma and runs_on(described, t)]
                measured = group[0]
            key = json.dumps([ident, measured.capability])
            if key not in jobs or through == "cubin":
                jobs[key] = (*entry, measured.capability, through)
            wanted.append((entry, target, key))
    return wanted


def collect_uses(
    wanted: Sequence[Wanted], jobs: Mapping[str, Job], results: Mapping[str, dict]
) -> list[SharedMemoryUse]:
    """:class:`SharedMemoryUse` of each planned ``(launch, target, key)`` from the jobs' results."""
    measured = {t.capability: t for t in TARGETS}
    return [
        SharedMemoryUse(
            module=entry[0],
            kernel=entry[1],
            target=target,
            described=entry[2],
            options=entry[3],
            shared=results[key].get("shared"),
            error=results[key].get("error"),
            measured_on=measured.get(jobs[key][4], target),
        )
        for entry, target, key in wanted
    ]


def plan_fit_jobs(
    launches_by_target: Mapping[GpuTarget, Iterable[tuple]],
    jobs: dict[str, Job],
    *,
    through: Literal["cubin", "llir"] = "llir",
) -> list[Wanted]:
    """Jobs (added to ``jobs``) that measure each launch on each target it is listed for and can
    run on, one compile per launch and :attr:`GpuTarget.mma` group; returns what each target
    reads, as :func:`plan_jobs` does."""
    listed: dict[str, tuple[tuple, list[GpuTarget]]] = {}
    for target, launches in launches_by_target.items():
        for launch in launches:
            module, name, described, *rest = launch
            options = dict(rest[0] if rest else getattr(launch, "options", {}))
            entry = (module, name, dict(described), options)
            listed.setdefault(json.dumps(entry, sort_keys=True), (entry, []))[1].append(target)
    wanted: list[Wanted] = []
    for entry, targets in listed.values():
        wanted += plan_jobs([entry], targets, jobs, through=through, share_by_mma=True)
    return wanted


def check_launches(launches_by_target: Mapping[GpuTarget, Iterable[tuple]]) -> list[str]:
    """What does not fit: one message per launch and target it is listed for (and can run on)
    whose shared memory exceeds the target's, or whose compile failed. The compiles stop at LLVM
    IR and run once per launch and ``mma`` group. For launches a plan chooses per device: list
    what each simulated target's plan launched (:func:`~triton_dispatch.device.simulated_device`,
    :func:`~triton_dispatch.compile_check.recorded_launches`)."""
    from .compile_worker import run_compile_jobs

    jobs: dict[str, Job] = {}
    wanted = plan_fit_jobs(launches_by_target, jobs)
    results = dict(zip(jobs, run_compile_jobs(list(jobs.values()))))
    return [str(use) for use in collect_uses(wanted, jobs, results) if not use.fits]


def compile_for_targets(
    launches: Iterable[tuple],
    targets: Sequence[GpuTarget] = TARGETS,
    *,
    through: Literal["cubin", "llir"] = "cubin",
    share_by_mma: bool = False,
) -> list[SharedMemoryUse]:
    """Compile every launch for every target it can run on (:func:`runs_on`) on this machine, and
    report each one's shared memory.

    Args:
        launches: ``(module, name, described, options)`` tuples (see :func:`describe_launch`; the
            launches :func:`~triton_dispatch.compile_check.recorded_launches` records, with their
            ``options``, do as well).
        targets: the targets to compile for.
        through: ``"cubin"``, the whole compile (``ptxas`` included, so its errors show);
            ``"llir"`` stops once shared memory is allocated (less than half the time).
        share_by_mma: compile once per :attr:`GpuTarget.mma` group and give that compile's shared
            memory to every target of the group (see :data:`TARGETS` for the measurement that
            allows it).

    Identical launches compile once per target; the compiles run in a subprocess with the
    interpreter off, one per CPU core. Returns one :class:`SharedMemoryUse` per distinct launch
    and target it runs on, in order.
    """
    from .compile_worker import run_compile_jobs

    jobs: dict[str, Job] = {}
    wanted = plan_jobs(launches, targets, jobs, through=through, share_by_mma=share_by_mma)
    results = dict(zip(jobs, run_compile_jobs(list(jobs.values()))))
    return collect_uses(wanted, jobs, results)
