"""A Triton kernel with a config space that picks its launch config without benchmarking.

On the first call of each shape regime (its autotune key), :class:`TunedKernel` takes, in order:

1. the autotuning result persisted on disk for this device, Triton version and kernel source
   (:mod:`triton_dispatch.tuning_cache`), if an earlier process tuned this regime;
2. the rows of the package's shipped tables (:mod:`triton_dispatch.launch_configs`), in the
   order the running card reads them (:mod:`triton_dispatch.table_rows`): its own row for the
   regime, the rows of cards of its compute capability nearest key first, then other cards'
   rows, nearest card first;
3. a heuristic: the kernel's declared default config, kept within what the device's facts allow
   (the shared-memory prune, shallower pipelines before Ampere), then the rest of the space,
   nearest the default first.

A card with no row of its own for the kernel (an H200 where only the H100's table has it) does
not take a borrowed row untimed on a GPU: the first call of each regime times a short list (each
card's pick for the regime and the heuristic's default) within a bound and keeps the fastest on
disk (:mod:`triton_dispatch.bounded_tune`; ``TRITON_DISPATCH_BOUNDED_TUNE=0`` turns it off).

Before its first launch on a GPU, the chosen config is compiled (the compile the launch needs, not
an extra one) and its shared memory compared with the device's limit: a config that does not fit
is passed over for the next one of that order (:mod:`triton_dispatch.shared_memory`), so a table
tuned on a larger card never launches what a smaller one cannot run.

Only with autotuning switched on does it benchmark the (pruned) space, as ``triton.autotune``
does, leaving out the configs that do not fit the device, and then it writes the winner to disk.
The switch is one environment variable for every package, ``TRITON_DISPATCH_AUTOTUNE``
(``1``/``all``, or a comma list of package import names), a per-package ``<PACKAGE>_AUTOTUNE``
(``LATE_INTERACTION_KERNELS_AUTOTUNE=1``), or :func:`set_autotune` at run time. Either way a
regime's choice is made once per process.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from triton.runtime.autotuner import Autotuner

from . import autotune_mode, bounded_tune, launch_configs, prime, tuning_cache
from .backend import interpreter_enabled
from .cards import Card, as_card, card_of
from .device import DeviceFacts, device_facts
from .shared_memory import SharedMemoryError, compiled_shared_memory, too_large_message
from .table_rows import RankedRow, rows_by_nearness

#: Where a regime's config came from: ``cache`` (a pick persisted on disk: autotuning's or the
#: short tune's), ``table`` (the card's own row for the regime), ``nearest`` (its own row for a
#: neighbouring regime), ``borrowed`` (a row another card measured), ``heuristic``,
#: ``benchmark`` (autotuned in this process), ``bounded`` (the short tune's pick, timed in this
#: process).
SOURCES = ("cache", "table", "nearest", "borrowed", "heuristic", "benchmark", "bounded")

Default = Any  # a triton.Config, or ``f(named_args) -> triton.Config``


def _median_ms(timing) -> float:
    """A trial's time: Triton's ``_bench`` gives the (median, low, high) quantiles, or one value."""
    return float(timing[0] if isinstance(timing, (list, tuple)) else timing)


def _closeness(a, b) -> int:
    """How many launch settings two configs share (for the config nearest a default)."""
    ka, kb = a.all_kwargs(), b.all_kwargs()
    return sum(ka.get(n) == kb.get(n) for n in set(ka) | set(kb))


class TunedKernel(Autotuner):
    """``triton.autotune``'s wrapper with table and heuristic selection first (see the module).

    Built by :func:`triton_dispatch.autotune`; kernels launch it like any autotuned kernel.

    Attributes:
        name, package: the kernel's function name and its top-level package (its table's owner).
        space: the whole config space (under the interpreter ``configs`` holds the one config
            that runs there, ``space`` still the GPU's, for selection tests).
        sources: where each regime key's config came from (:data:`SOURCES`).
        tuned: ``{key: (config, ms)}`` of regimes autotuned (or their autotuning read from disk)
            in this process, what ``python -m triton_dispatch.tune`` writes into tables (the
            short tune's picks are not: they are the best of a few, not of the space).
        too_large: ``{key: [(config, bytes), ...]}``: the configs of a regime passed over
            because their compiled kernels need more shared memory than the device has.
    """

    def __init__(
        self,
        fn,
        configs: Sequence,
        key: Sequence[str],
        *,
        default: Default = None,
        prune: Callable[..., list] | None = None,
        reset_to_zero: Iterable[str] | None = None,
        restore_value: Iterable[str] | None = None,
        interpret_config=None,
        do_bench: Callable | None = None,
    ) -> None:
        self.space = list(configs)
        interpreting = interpreter_enabled()
        runs = [interpret_config or self.space[0]] if interpreting else self.space
        super().__init__(
            fn,
            fn.arg_names,
            runs,
            list(key),
            None if interpreting else reset_to_zero,
            None if interpreting else restore_value,
            prune_configs_by={"early_config_prune": prune} if prune and not interpreting else None,
            do_bench=do_bench,
        )
        self.prune = prune
        self.default = default
        self.name: str = self.base_fn.__name__
        self.package: str = self.base_fn.__module__.split(".")[0]
        self.sources: dict[tuple, str] = {}
        self.tuned: dict[tuple, tuple[Any, float | None]] = {}
        #: every full benchmark of a regime in this process, in order: ``{config: ms}`` each
        #: (several when :meth:`forget_regimes` let later shapes of a regime benchmark it again)
        self.timings: dict[tuple, list[dict[Any, float]]] = {}
        self.too_large: dict[tuple, list[tuple[Any, int]]] = {}
        self._identities: dict[tuple[str, str], dict] = {}
        self._timing_briefly = False
        self._lock = threading.RLock()
        autotune_mode.register(self)

    # -- the call path ------------------------------------------------------------------------

    def run(self, *args: Any, **kwargs: Any):
        with self._lock:  # nargs is per-call state; warm-ups may call from several threads
            self.nargs = dict(zip(self.arg_names, args))
            try:
                if len(self.configs) == 1:
                    config = self.configs[0]
                else:
                    key = self.regime_key({**self.nargs, **kwargs})
                    config = self.cache.get(key)
                    if config is None:
                        config = self._first_call(key, args, kwargs)
                        if config is None:  # a compile ahead of a regime the real call tunes
                            return None
                        self.cache[key] = config
                self.best_config = config
                if config.pre_hook is not None:
                    config.pre_hook({**self.nargs, **kwargs, **config.all_kwargs()})
                return self.fn.run(*args, **kwargs, **config.all_kwargs())
            finally:
                self.nargs = None

    def forget_regimes(self) -> None:
        """Drop every regime's choice of this process (not :attr:`timings`), so the next call
        of each regime selects again: the tuning command benchmarks a regime once per shape
        that reaches it."""
        with self._lock:
            self.cache.clear()
            self.tuned.clear()
            self.sources.clear()

    def regime_key(self, named: Mapping[str, Any]) -> tuple:
        """The autotune key of one call as ``((name, value), ...)``: the key arguments, then the
        dtype of each tensor argument (what ``triton.autotune`` keys on, with names)."""
        known = {k: v for k, v in named.items() if k in self.arg_names}
        key = [(k, known[k]) for k in self.keys if k in known]
        key += [(k, str(v.dtype)) for k, v in known.items() if hasattr(v, "dtype")]
        return tuple(key)

    def _first_call(self, key: tuple, args: tuple, kwargs: dict):
        prime.wait()
        named = dict(key)
        device = self._device({**self.nargs, **kwargs})
        stored = self._stored(named, device)
        if stored is not None:
            config, ms, search = stored
            if search == "full":  # a short tune's pick is no table row (see ``tuned``)
                self.tuned[key] = (config, ms)
            self.sources[key] = "cache"
            return config
        pruned = self.prune_configs(kwargs)
        facts = device_facts(device)
        if autotune_mode.autotune_enabled(self.package):
            fitting = [c for c in pruned if self._fits(key, c, args, kwargs, facts)]
            if not fitting:
                raise SharedMemoryError(too_large_message(self.name, facts, self.too_large[key]))
            config, ms = self._benchmark(args, kwargs, fitting)
            self.tuned[key] = (config, ms)
            self.timings.setdefault(key, []).append(
                {c: _median_ms(t) for c, t in self.configs_timings.items()}
            )
            self.sources[key] = "benchmark"
            tuning_cache.store(self._identity(device), named, config, ms)
            return config
        card = card_of(facts)
        rows = self._table_configs(named, card, pruned)
        if self._tunes_briefly(device, rows):
            if kwargs.get("warmup"):
                # a compile ahead (stand-in tensors, nothing launched) cannot time trials: the
                # regime stays open for its first real call, which runs the short tune
                return None
            picked = self._tune_briefly(key, card, rows, pruned, args, kwargs, facts)
            if picked is not None:
                config, ms = picked
                self.sources[key] = "bounded"
                tuning_cache.store(self._identity(device, "bounded"), named, config, ms)
                return config
        ranked = self._ranked_from(rows, card, pruned, self.nargs | kwargs)
        for config, source in ranked:
            if self._fits(key, config, args, kwargs, facts):
                self.sources[key] = source
                return config
        raise SharedMemoryError(too_large_message(self.name, facts, self.too_large[key]))

    def _tunes_briefly(self, device: torch.device, rows: Sequence[tuple[Any, RankedRow]]) -> bool:
        """Whether this regime's first call runs the short tune: on a GPU (never under the
        interpreter, nor while a CUDA graph is being captured), switched on, and no row of the
        running card's own for this kernel."""
        if interpreter_enabled() or not bounded_tune.bounded_tune_enabled():
            return False
        if any(ranked.own for _, ranked in rows):
            return False
        return not (device.type == "cuda" and torch.cuda.is_current_stream_capturing())

    def _tune_briefly(
        self,
        key: tuple,
        card: Card,
        rows: Sequence[tuple[Any, RankedRow]],
        candidates: Sequence,
        args: tuple,
        kwargs: dict,
        facts: DeviceFacts,
    ) -> tuple[Any, float] | None:
        """Time the short list (:mod:`triton_dispatch.bounded_tune`) of configs that fit the
        device; ``(fastest, ms)``, or ``None`` when fewer than two could be compared."""
        default = self.heuristic(card.capability, candidates, self.nargs | kwargs)
        shortlist = bounded_tune.short_list(bounded_tune.card_picks(rows), default)
        if len(shortlist) < 2:
            return None

        def time_one(config) -> float | None:
            if not self._fits(key, config, args, kwargs, facts):
                return None
            return _median_ms(self._bench(*args, config=config, **kwargs))

        self._timing_briefly = True
        try:
            picked = bounded_tune.fastest(shortlist, time_one)
        finally:
            self._timing_briefly = False
        if picked is None:
            return None
        config, ms, timed = picked
        if len(timed) < 2:
            return None
        self.pre_hook({**self.nargs, **kwargs, **config.all_kwargs()}, reset_only=True)
        self.configs_timings = dict(timed)
        return config, ms

    @property
    def do_bench(self):
        """The timing function of trials: the one given to :func:`~triton_dispatch.autotune`,
        else Triton's, shortened during a short tune (:func:`bounded_tune.brief_do_bench`)."""
        given = getattr(self, "_do_bench", None)
        if given is not None:
            return given
        if getattr(self, "_timing_briefly", False):
            return bounded_tune.brief_do_bench
        from triton.runtime.driver import driver

        return driver.active.get_benchmarker()

    @do_bench.setter
    def do_bench(self, value) -> None:  # Tritons that assign it in ``Autotuner.__init__``
        self._do_bench = value

    def _fits(self, key: tuple, config, args: tuple, kwargs: dict, facts: DeviceFacts) -> bool:
        """Whether ``config``'s kernel for this call fits the device's shared memory per block:
        compiled without launching (the compile its launch needs; Triton keeps it for the
        launch), its ``metadata.shared`` read. Always true under the interpreter (nothing is
        compiled there). A config that does not fit is noted in :attr:`too_large`."""
        if interpreter_enabled():
            return True
        meta = {**kwargs, **config.all_kwargs(), "warmup": True}
        shared = compiled_shared_memory(self.fn.run(*args, **meta))
        if shared <= facts.shared_memory_per_block:
            return True
        noted = self.too_large.setdefault(key, [])
        if not any(launch_configs.same_config(config, c) for c, _ in noted):
            noted.append((config, shared))
        return False

    # -- selection without benchmarks ---------------------------------------------------------

    def select(
        self,
        key: Mapping[str, Any],
        card: Card | tuple[int, int],
        candidates: Sequence | None = None,
        named_args: Mapping[str, Any] | None = None,
    ) -> tuple[Any, str]:
        """The config for one regime on ``card`` (or a compute capability, standing for its
        family's first known card), without benchmarking or compiling: the first of
        :meth:`ranked`, ``(config, source)``."""
        return self.ranked(key, card, candidates, named_args)[0]

    def ranked(
        self,
        key: Mapping[str, Any],
        card: Card | tuple[int, int],
        candidates: Sequence | None = None,
        named_args: Mapping[str, Any] | None = None,
    ) -> list[tuple[Any, str]]:
        """Every config allowed for one regime on ``card`` (a
        :class:`~triton_dispatch.cards.Card`, or a compute capability standing for its family's
        first known card), in the order the first call tries them, as ``(config, source)``
        (``source`` one of ``table``, ``nearest``, ``borrowed``, ``heuristic``): the tables' rows
        in the order the card reads them (:mod:`triton_dispatch.table_rows`); the heuristic's
        default; the rest of the candidates, nearest the default first.

        ``candidates`` are the configs allowed on the device (the space pruned by the kernel's
        ``prune`` hook; the whole space when ``None``). Table rows whose config is not a
        candidate are passed over, so a stale row or one the hook rules out never launches.
        """
        card = as_card(card)
        candidates = list(candidates) if candidates is not None else self.space
        rows = self._table_configs(key, card, candidates)
        return self._ranked_from(rows, card, candidates, named_args or {})

    def _table_configs(
        self, key: Mapping[str, Any], card: Card, candidates: Sequence
    ) -> list[tuple[Any, RankedRow]]:
        """The candidate config of each table row for the regime, in the card's reading order
        (rows whose config is not a candidate left out)."""
        wanted = {k: launch_configs.jsonable(v) for k, v in key.items()}
        tables = launch_configs.package_tables(self.package)
        out = []
        for ranked in rows_by_nearness(tables, self.name, wanted, card):
            try:
                config = launch_configs.config_from_json(ranked.row.get("config"))
            except ValueError:
                continue
            match = next((c for c in candidates if launch_configs.same_config(c, config)), None)
            if match is not None:
                out.append((match, ranked))
        return out

    def _ranked_from(
        self,
        rows: Sequence[tuple[Any, RankedRow]],
        card: Card,
        candidates: Sequence,
        named_args: Mapping[str, Any],
    ) -> list[tuple[Any, str]]:
        out: list[tuple[Any, str]] = []

        def add(config, source: str) -> None:
            if not any(launch_configs.same_config(config, c) for c, _ in out):
                out.append((config, source))

        for config, ranked in rows:
            if ranked.own:
                add(config, "table" if ranked.distance == 0 else "nearest")
            else:
                add(config, "borrowed")
        default = self.heuristic(card.capability, candidates, named_args)
        add(default, "heuristic")
        rest = list(candidates) or self.space
        for config in sorted(rest, key=lambda c: (-_closeness(c, default), rest.index(c))):
            add(config, "heuristic")
        return out

    def heuristic(self, capability: tuple[int, int], candidates: Sequence, named_args: Mapping):
        """The declared default when the device allows it, else the allowed config nearest it.

        Before Ampere there is no asynchronous copy to pipeline, so deep pipelines only cost
        shared memory: configs with at most two stages come first there.
        """
        candidates = list(candidates) or self.space
        if capability < (8, 0):
            shallow = [c for c in candidates if c.num_stages <= 2]
            candidates = shallow or candidates
        default = self.default(named_args) if callable(self.default) else self.default
        if default is None:
            return candidates[0]
        return max(candidates, key=lambda c: (_closeness(c, default), -candidates.index(c)))

    # -- autotuning and its disk cache ----------------------------------------------------------

    def _bench(self, *args: Any, config, **meta: Any):
        autotune_mode.count_benchmark()
        return super()._bench(*args, config=config, **meta)

    def _benchmark(self, args: tuple, kwargs: dict, pruned: list) -> tuple[Any, float | None]:
        timings = {c: self._bench(*args, config=c, **kwargs) for c in pruned}
        best = min(timings, key=timings.get)
        self.pre_hook({**self.nargs, **kwargs, **best.all_kwargs()}, reset_only=True)
        self.configs_timings = timings
        return best, _median_ms(timings[best])

    def _device(self, named: Mapping[str, Any]) -> torch.device:
        tensor = next((v for v in named.values() if isinstance(v, torch.Tensor)), None)
        return tensor.device if tensor is not None else torch.device("cpu")

    def _identity(self, device: torch.device, search: str = "full") -> dict:
        """The tuning-cache identity of this kernel on ``device``; a short tune's (``search``
        ``"bounded"``) also holds every table row of the kernel, so that new tables (a card's
        own, or other picks to time) set earlier picks aside."""
        facts = device_facts(device)
        ident = self._identities.get((facts.name, search))
        if ident is None:
            import triton

            space = repr([(self.keys, str(c)) for c in self.space])
            if search != "full":
                rows = {t.name: t.kernels.get(self.name, [])
                        for t in launch_configs.package_tables(self.package)}  # fmt: skip
                space += json.dumps(rows, sort_keys=True, default=str)
            source = getattr(self.base_jit, "cache_key", None) or self.name
            ident = tuning_cache.identity(
                kernel=f"{self.package}.{self.name}",
                device=f"{facts.name} sm{facts.capability[0]}{facts.capability[1]}",
                triton_version=triton.__version__,
                source=str(source),
                space=space,
                search=search,
            )
            self._identities[(facts.name, search)] = ident
        return ident

    def _stored(self, key: Mapping[str, Any], device: torch.device):
        """A pick kept on disk for this regime as ``(config, ms, search)``: full autotuning's,
        else (unless autotuning is on, which measures the whole space) the short tune's while
        that is on; ``None`` when there is none."""
        if interpreter_enabled() or not tuning_cache.cache_enabled():
            return None
        searches = ["full"]
        if not autotune_mode.autotune_enabled(self.package) and bounded_tune.bounded_tune_enabled():
            searches.append("bounded")
        wanted = tuning_cache.key_string(key)
        for search in searches:
            found = tuning_cache.load(self._identity(device, search)).get(wanted)
            if found is not None and any(
                launch_configs.same_config(found[0], c) for c in self.space
            ):
                return (*found, search)
        return None

    @property
    def base_jit(self):
        """The ``JITFunction`` inside any wrappers."""
        fn = self.fn
        while not hasattr(fn, "arg_names") or hasattr(fn, "configs"):
            fn = fn.fn
        return fn


__all__ = ["SOURCES", "TunedKernel"]
