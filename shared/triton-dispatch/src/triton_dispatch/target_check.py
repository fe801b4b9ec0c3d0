"""The CPU check that the configs a package's tuned kernels launch fit every supported GPU.

For each tuned kernel of a package (:func:`~triton_dispatch.autotune_mode.tuned_kernels`), each
shape regime it has a table row for (every shipped table's keys) or that a warm-up launched, and
each known card (:data:`~triton_dispatch.cards.KNOWN_CARDS`) of each target of
:data:`~triton_dispatch.gpu_targets.TARGETS` (cards of one target read different tables: an H200
its own rows, an H100 its own), :func:`planned_launches` works out the config the runtime picks
first on that card without compiling anything: the kernel's own
:meth:`~triton_dispatch.tuned_kernel.TunedKernel.ranked` order, with its ``prune`` hook run
against the card's shared memory (:func:`~triton_dispatch.device.simulated_device`). The
launch it compiles is a recorded interpreter launch of the kernel (the one closest to the regime)
with the regime's key and the config laid over it, so block sizes, head dimensions and dtypes
are the GPU's. :func:`check_targets` compiles each for its target and reports the ones that
need more shared memory than the target has: those the runtime guard
(:mod:`triton_dispatch.shared_memory`) would have to pass over on that card, costing a compile
on its first call, or fail on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .cards import KNOWN_CARDS, Card, family_card
from .compile_check import recorded_launches
from .compile_worker import DTYPE_NAMES, describe, run_compile_jobs
from .device import simulated_device
from .gpu_targets import TARGETS, GpuTarget, SharedMemoryUse, collect_uses, plan_jobs, runs_on
from .launch_configs import import_kernel_modules, jsonable, shipped_tables

__all__ = [
    "EXHAUSTIVE_ENV_VAR",
    "EXHAUSTIVE_SKIP",
    "PlannedLaunch",
    "cards_of",
    "check_targets",
    "exhaustive_requested",
    "planned_launches",
]

#: ``1`` runs the exhaustive target checks (``check_targets(..., exhaustive=True)``): every
#: fallback config, every target compiled whole, many minutes on two cores. The test suite runs
#: tests marked ``slow`` by default, so the marker alone would not keep them out of CI.
EXHAUSTIVE_ENV_VAR = "TRITON_DISPATCH_EXHAUSTIVE_TARGETS"
#: The skip reason of an exhaustive target test that was not asked for.
EXHAUSTIVE_SKIP = f"minutes of compiles on a CPU: set {EXHAUSTIVE_ENV_VAR}=1"


def exhaustive_requested() -> bool:
    """Whether :data:`EXHAUSTIVE_ENV_VAR` asks for the exhaustive target checks."""
    return os.environ.get(EXHAUSTIVE_ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class PlannedLaunch:
    """A launch the runtime would make on ``card``, a card of ``target``: ``kernel``'s
    ``config`` for the regime ``key``, taken from ``source`` (``table``, ``nearest``,
    ``borrowed``, ``heuristic``) at position ``rank`` of the kernel's order (0: its first
    choice; later ones are what the guard falls back to); ``launch`` is ``(module, name,
    described, options)`` to compile."""

    target: GpuTarget
    kernel: str
    key: Mapping[str, Any]
    config: Any
    source: str
    rank: int
    launch: tuple
    card: Card | None = None


def cards_of(target: GpuTarget) -> list[Card]:
    """The known cards of ``target`` (its family's stand-in when the registry has none)."""
    known = [c for c in KNOWN_CARDS if c.capability == target.compute_capability]
    return known or [family_card(target.compute_capability)]


def _torch_dtype(name: str) -> torch.dtype | None:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    return dtype if isinstance(dtype, torch.dtype) else None


def _regime_key(kernel, described: Mapping[str, list]) -> dict[str, Any]:
    """The regime key (as tables store it) of a recorded launch: the key arguments, then each
    tensor argument's dtype (:meth:`~triton_dispatch.tuned_kernel.TunedKernel.regime_key`)."""
    names = {v: k for k, v in DTYPE_NAMES.items()}
    key = {k: described[k][1] for k in kernel.keys if k in described}
    key.update(
        {n: str(names[v]) for n, (kind, v) in described.items() if kind == "ptr" and v in names}
    )
    return key


def _laid_over(described: Mapping[str, list], values: Mapping[str, Any]) -> dict[str, list]:
    """``described`` with the arguments named in ``values`` replaced (a dtype name for a
    pointer; a number, flag or string for the others)."""
    out = dict(described)
    for name, value in values.items():
        if name not in out:
            continue
        if out[name][0] == "ptr" and isinstance(value, str):
            dtype = _torch_dtype(value)
            if dtype is not None:
                out[name] = describe(torch.empty(0, dtype=dtype))
        elif describe(value) is not None:
            out[name] = describe(value)
    return out


def _named_args(described: Mapping[str, list]) -> dict[str, Any]:
    """Arguments a ``prune`` hook can read: empty tensors of each pointer's dtype, the values."""
    names = {v: k for k, v in DTYPE_NAMES.items()}
    return {
        n: torch.empty(0, dtype=names[v]) if kind == "ptr" else v
        for n, (kind, v) in described.items()
    }


def _closest(recorded: Sequence[Mapping[str, list]], key: Mapping[str, Any], kernel) -> dict:
    """The recorded launch whose own regime shares most of ``key`` (its constexprs that are not
    key fields, such as a precision flag that follows the dtype, then match best)."""

    def shared(described) -> int:
        own = _regime_key(kernel, described)
        return sum(own.get(k) == v for k, v in key.items())

    return dict(max(recorded, key=shared))


def _options(config) -> dict[str, Any]:
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    if getattr(config, "num_ctas", 1) not in (None, 1):
        options["num_ctas"] = config.num_ctas
    if getattr(config, "maxnreg", None) is not None:
        options["maxnreg"] = config.maxnreg
    return options


def planned_launches(
    package: str,
    calls: Iterable[tuple],
    *,
    targets: Sequence[GpuTarget] = TARGETS,
    every_config: bool = False,
) -> list[PlannedLaunch]:
    """What ``package``'s tuned kernels launch on each known card of each target, for each
    regime of their tables and of ``calls`` (launches recorded under the interpreter, each
    kernel's arguments taken from them): the first config of each kernel's order, or with
    ``every_config`` every config the runtime may fall back to. Kernels ``calls`` never launched
    are left out."""
    from .autotune_mode import tuned_kernels

    import_kernel_modules(package)
    tables = shipped_tables(package)
    recorded: dict[tuple[str, str], list[dict]] = {}  # by (module, name): names repeat
    for module, name, described, *_ in calls:
        if all(d is not None for d in described.values()):
            recorded.setdefault((module, name), []).append(described)
    plans: list[PlannedLaunch] = []
    for kernel in tuned_kernels(package):
        module = kernel.base_fn.__module__
        launches = recorded.get((module, kernel.name))
        if not launches:
            continue
        keys = {}
        for key in [row["key"] for t in tables.values() for row in t.get(kernel.name, [])] + [
            _regime_key(kernel, d) for d in launches
        ]:
            keys.setdefault(json.dumps(key, sort_keys=True), key)
        for key in keys.values():
            regime = _laid_over(_closest(launches, key, kernel), key)
            for target in targets:
                if not runs_on(regime, target):
                    continue
                for card in cards_of(target):
                    plans += _card_plans(kernel, module, key, regime, target, card, every_config)
    return plans


def _card_plans(
    kernel, module: str, key, regime: dict, target: GpuTarget, card: Card, every_config: bool
) -> list[PlannedLaunch]:
    """The launches ``card`` makes for one regime of ``kernel`` (its first, or every one)."""
    named = _named_args(regime)
    with simulated_device(card.facts()):
        candidates = kernel.prune(kernel.space, named) if kernel.prune else kernel.space
        ranked = kernel.ranked(key, card, candidates, named)
    plans = []
    for rank, (config, source) in enumerate(ranked if every_config else ranked[:1]):
        launch = (module, kernel.name, _laid_over(regime, config.kwargs), _options(config))
        plans.append(PlannedLaunch(target, kernel.name, key, config, source, rank, launch, card))
    return plans


def _misfit(plan: PlannedLaunch, use: SharedMemoryUse) -> str:
    key = {k: jsonable(v) for k, v in plan.key.items() if not str(v).startswith("torch.")}
    card = plan.card.name if plan.card is not None else plan.target.cards
    return (
        f"{plan.target.name} ({card}): {plan.kernel} at {key} would launch the "
        f"{plan.source} config {plan.config}, which needs {use.shared} bytes of shared memory; "
        f"the target has {plan.target.shared_memory_per_block} per block (measured on "
        f"{use.measured_on.name if use.measured_on else plan.target.name})"
    )


def check_targets(
    package: str,
    warm: Callable[[], object],
    *,
    skip: Mapping[str, str] | None = None,
    targets: Sequence[GpuTarget] = TARGETS,
    exhaustive: bool = False,
) -> tuple[list[str], list[tuple[PlannedLaunch, SharedMemoryUse]]]:
    """Check that the first config each target launches for ``package``'s tuned kernels fits
    its shared memory, the kernels' arguments recorded while ``warm()`` runs under the
    interpreter. Returns ``(failures, measured)``: the failures (compile errors, first choices
    that do not fit, tuned kernels ``warm()`` never launched unless ``skip`` says why), and every
    plan with what it needs.

    By default each launch compiles up to LLVM IR (where Triton allocates shared memory; the
    front end's errors show, those of ``ptxas`` do not), once per ``mma`` group (what
    :data:`~triton_dispatch.gpu_targets.TARGETS` measured equal). ``exhaustive`` also compiles
    every config the runtime may fall back to (the guard's and autotuning's candidates), every
    target whole (``ptxas`` included) and on its own, and fails where targets of one ``mma``
    group disagree (the measurement behind the sharing).
    """
    from .autotune_mode import tuned_kernels

    import_kernel_modules(package)
    with recorded_launches() as calls:
        warm()
    plans = planned_launches(package, calls, targets=targets, every_config=exhaustive)
    planned = {p.launch[:2] for p in plans}
    failures = [
        f"{k.base_fn.__module__}.{k.name}: not launched by the warm-up"
        for k in tuned_kernels(package)
        if (k.base_fn.__module__, k.name) not in planned and k.name not in (skip or {})
    ]
    jobs: dict[str, tuple] = {}
    wanted = []
    for plan in plans:
        measured = plan.target
        if not exhaustive:  # one compile per mma group, on the group's first target
            group = [t for t in targets if t.mma == measured.mma and runs_on(plan.launch[2], t)]
            measured = group[0]
        for entry, _, key in plan_jobs([plan.launch], [measured], jobs,
                                       through="cubin" if exhaustive else "llir"):  # fmt: skip
            wanted.append((entry, plan.target, key))
    results = dict(zip(jobs, run_compile_jobs(list(jobs.values()))))
    uses = collect_uses(wanted, jobs, results)
    measured = list(zip(plans, uses))
    errors = {use.error for _, use in measured if use.error is not None}
    failures += sorted(errors)
    first = [(p, u) for p, u in measured if p.rank == 0 and u.error is None]
    failures += [_misfit(p, u) for p, u in first if not u.fits]
    if exhaustive:
        failures += _group_disagreements(measured)
    return failures, measured


def _group_disagreements(measured: Sequence[tuple[PlannedLaunch, SharedMemoryUse]]) -> list[str]:
    """Launches whose shared memory differs between targets of one ``mma`` group."""
    by_launch: dict[tuple[str, str], dict[int, int]] = {}
    for plan, use in measured:
        if use.shared is not None:
            ident = (json.dumps(plan.launch, sort_keys=True), plan.target.mma)
            by_launch.setdefault(ident, {})[plan.target.capability] = use.shared
    return [
        f"targets of one mma group ({mma}) disagree: {sizes} for {json.loads(launch)[1]}"
        for (launch, mma), sizes in by_launch.items()
        if len(set(sizes.values())) > 1
    ]
