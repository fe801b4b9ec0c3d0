"""The runtime guard that keeps launches within the device's shared memory per block.

A config chosen on one card (a table tuned on an H100, a default written for Hopper) can need
more shared memory than another card has (99 KB per block on an RTX 4090 or 5090, 227 KB on an
H100): Triton would compile it and then refuse the launch with ``OutOfResources``. Estimates of a
kernel's shared memory drift from what Triton allocates (its layouts, its pipeliner, the MMA
generation), so the guard reads the truth instead: the compiled kernel's ``metadata.shared``.

Where a config is chosen for a device, the first launch of it compiles without launching
(``warmup=True``, which a launch would do anyway and which Triton caches, so the real launch that
follows compiles nothing), compares ``metadata.shared`` with the device's
``shared_memory_per_block`` (:func:`~triton_dispatch.device.device_facts`, the opt-in limit) and,
when it does not fit, moves to the next candidate:

* a tuned kernel (:class:`~triton_dispatch.tuned_kernel.TunedKernel`) walks its ranked configs
  for the regime (table rows, rows of the nearest other card's table, the heuristic's default,
  the rest of its space) and takes the first that fits; autotuning benchmarks only the ones that
  fit;
* a launch whose options the code chose (:class:`~triton_dispatch.launch.KernelLaunch`) keeps
  its block sizes and pipelines less deeply (``num_stages`` down to 1), the only change that
  keeps what the kernel computes and its grid.

Nothing fits: :class:`SharedMemoryError` names the kernel, the device, its limit and what each
candidate needed. The guard runs once per regime (or per launch object), never on a repeat call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .device import DeviceFacts

__all__ = ["SharedMemoryError", "compiled_shared_memory", "fitting_options", "too_large_message"]


class SharedMemoryError(RuntimeError):
    """No launch config a kernel may use fits the device's shared memory per block."""


def _metadata(compiled: Any) -> Any:
    if hasattr(compiled, "result"):  # a compile Triton ran asynchronously
        compiled = compiled.result()
    return getattr(compiled, "metadata", None)


def compiled_shared_memory(compiled: Any) -> int:
    """Bytes of shared memory one program of a compiled kernel uses (``metadata.shared``; 0 for
    what is not a compiled kernel, e.g. a launch the interpreter ran)."""
    return int(getattr(_metadata(compiled), "shared", 0) or 0)


def too_large_message(kernel: str, facts: DeviceFacts, tried: Sequence[tuple[Any, int]]) -> str:
    """The error of :class:`SharedMemoryError`: what each ``(config, bytes)`` tried needed."""
    needs = "; ".join(f"{config} needs {shared} bytes" for config, shared in tried)
    return (
        f"{kernel}: no launch config fits the {facts.shared_memory_per_block} bytes of shared "
        f"memory per block of {facts.name} (sm_{facts.capability[0]}{facts.capability[1]}): "
        f"{needs}. Add a smaller config to the kernel's space, or tune a table for this card "
        "(python -m triton_dispatch.tune)."
    )


def fitting_options(
    compile_only: Callable[[Mapping[str, Any]], Any],
    options: Mapping[str, Any],
    facts: DeviceFacts,
    kernel: str,
) -> dict[str, Any]:
    """``options`` with the deepest pipeline (``num_stages``, at most the given one) whose kernel
    fits ``facts``' shared memory per block.

    ``compile_only(options)`` compiles the launch with those options without running it and
    returns the compiled kernel. The given options come first, so a launch that fits costs this
    one compile, which the launch then reuses. ``SharedMemoryError`` when even one stage does
    not fit."""
    limit = facts.shared_memory_per_block
    compiled = compile_only(options)
    shared = compiled_shared_memory(compiled)
    if shared <= limit:
        return dict(options)
    stages = options.get("num_stages", getattr(_metadata(compiled), "num_stages", 3))
    tried = [(dict(options), shared)]
    for fewer in range(int(stages) - 1, 0, -1):
        candidate = {**options, "num_stages": fewer}
        shared = compiled_shared_memory(compile_only(candidate))
        if shared <= limit:
            return candidate
        tried.append((candidate, shared))
    raise SharedMemoryError(too_large_message(kernel, facts, tried))
