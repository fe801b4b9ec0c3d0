"""Config spaces, shape-regime keys, shared-memory pruning, and :func:`autotune`.

Kernels in this workspace declare small config spaces keyed by *shape regimes* (padded or bucketed
sizes), never by raw batch sizes, so a training run that sees thousands of shapes selects a handful
of configs. By default a regime's config comes from the package's shipped table or a heuristic, not
from benchmarking (see :mod:`triton_dispatch.tuned_kernel`); under the Triton interpreter, which
cannot benchmark, every space collapses to its interpreter config.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .device import device_facts

if TYPE_CHECKING:
    from .tuned_kernel import TunedKernel


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def padded_dim(n: int, minimum: int = 16) -> int:
    """The block size a kernel uses for a dimension of size ``n``: the next power of two, at least
    ``minimum`` (``tl.dot`` needs 16)."""
    return max(next_power_of_2(n), minimum)


def shape_bucket(n: int, *, minimum: int = 1, maximum: int | None = None) -> int:
    """The power-of-two regime of a size, for autotune keys: ``n`` rounded up to a power of two and
    clamped to ``[minimum, maximum]``. Sizes in one bucket share one tuned config."""
    b = max(next_power_of_2(n), next_power_of_2(minimum))
    if maximum is not None:
        b = min(b, next_power_of_2(maximum))
    return b


def config_space(
    axes: Mapping[str, Sequence[Any]],
    *,
    num_warps: Sequence[int] = (4,),
    num_stages: Sequence[int] = (2,),
    where: Callable[[dict[str, Any], int, int], bool] | None = None,
) -> list:
    """The cartesian product of block-size ``axes`` × ``num_warps`` × ``num_stages`` as
    ``triton.Config`` objects, filtered by ``where(kwargs, num_warps, num_stages)``.

    Example:
        >>> configs = config_space({"BLOCK_M": [64, 128], "BLOCK_N": [64]}, num_warps=[4, 8])
        >>> len(configs)
        4
    """
    import triton

    names = list(axes)
    out = []
    for values in itertools.product(*(axes[n] for n in names)):
        kwargs = dict(zip(names, values))
        for warps, stages in itertools.product(num_warps, num_stages):
            if where is None or where(kwargs, warps, stages):
                out.append(triton.Config(dict(kwargs), num_warps=warps, num_stages=stages))
    if not out:
        raise ValueError("config_space(): every config was filtered out by `where`")
    return out


def tile_shared_memory(*tiles: tuple[int, int], element_size: int, num_stages: int = 1) -> int:
    """Shared-memory bytes of pipelined operand tiles: ``sum(rows·cols)·element_size·num_stages``.

    Pass each tile with its *padded* sizes (see :func:`padded_dim`): Triton allocates power-of-two
    blocks, so a head dimension of 96 occupies a 128-wide tile.
    """
    return sum(r * c for r, c in tiles) * element_size * max(num_stages, 1)


SharedMemoryEstimate = Callable[[Mapping[str, Any], int, Mapping[str, Any]], int]


def prune_by_shared_memory(
    estimate: SharedMemoryEstimate, *, device_arg: str | None = None, headroom: float = 1.0
) -> Callable[..., list]:
    """An ``early_config_prune`` hook that drops configs whose shared memory would not fit.

    Args:
        estimate: ``estimate(config.kwargs, config.num_stages, named_args) -> bytes``. Compute it
            with padded dims (:func:`padded_dim`, :func:`tile_shared_memory`).
        device_arg: name of a tensor argument whose device sets the limit; by default the first
            tensor argument found.
        headroom: fraction of the device limit a config may use.

    The hook never returns an empty list: if nothing fits it keeps the config with the smallest
    estimate, which the runtime guard (:mod:`triton_dispatch.shared_memory`) then measures, so a
    launch that cannot fit fails with its ``SharedMemoryError`` rather than an empty autotune
    space. The estimate only bounds the candidates; the guard decides on the compiled kernel.
    """

    def prune(configs: list, named_args: Mapping[str, Any], **kwargs: Any) -> list:
        args = {**named_args, **kwargs}
        tensor = args.get(device_arg) if device_arg else None
        if tensor is None:
            tensor = next((v for v in args.values() if isinstance(v, torch.Tensor)), None)
        limit = device_facts(tensor.device if tensor is not None else None).shared_memory_per_block
        budget = int(limit * headroom)
        sized = [(estimate({**c.kwargs, **kwargs}, c.num_stages, args), c) for c in configs]
        fitting = [c for need, c in sized if need <= budget]
        return fitting or [min(sized, key=lambda item: item[0])[1]]

    return prune


def autotune(
    configs: Sequence,
    key: Sequence[str],
    *,
    default: Any = None,
    prune: Callable[..., list] | None = None,
    reset_to_zero: Iterable[str] | None = None,
    restore_value: Iterable[str] | None = None,
    interpret_config: Any = None,
    do_bench: Callable[..., Any] | None = None,
) -> Callable[[Any], TunedKernel]:
    """Wrap a ``@triton.jit`` kernel with a config space, chosen per shape regime without
    benchmarking unless autotuning is switched on (see :class:`TunedKernel`).

    Args:
        configs: the space, usually from :func:`config_space`.
        key: argument names whose values select a config. Pass shape *regimes*
            (:func:`shape_bucket`, :func:`padded_dim` values computed by the launcher), never raw
            batch or document counts.
        default: the config the heuristic starts from where the package's table has no row for
            the device (a ``triton.Config`` or ``f(named_args) -> triton.Config``); by default the
            first of ``configs``.
        prune: an ``early_config_prune`` hook, e.g. :func:`prune_by_shared_memory`; it bounds
            table rows and the heuristic as well as autotuning.
        reset_to_zero: output arguments a kernel accumulates into with atomics. Autotuning runs the
            kernel once per config on the same buffers; without a reset, each trial adds to the
            previous one's result and the first real call returns a multiple of the answer.
        restore_value: in-place arguments restored after each trial.
        interpret_config: the one config used under ``TRITON_INTERPRET=1`` (default: the first of
            ``configs``). Pick small blocks: the interpreter runs each program in Python.
        do_bench: the timing function of autotune trials (Triton's by default).
    """
    configs = list(configs)
    if not configs:
        raise ValueError("autotune(): empty config space")

    def wrap(fn) -> TunedKernel:
        from .tuned_kernel import TunedKernel  # imports Triton: only once a kernel is declared

        return TunedKernel(
            fn,
            configs,
            key,
            default=default,
            prune=prune,
            reset_to_zero=reset_to_zero,
            restore_value=restore_value,
            interpret_config=interpret_config,
            do_bench=do_bench,
        )

    return wrap
