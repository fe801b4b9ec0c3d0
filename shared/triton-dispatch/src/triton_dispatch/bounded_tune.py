"""The short tune a card without rows of its own runs on a regime's first call.

A card with a table row for a kernel takes its config at once (:mod:`triton_dispatch.tuned_kernel`).
A card without one (an H200 reading the H100's table, an RTX 5090 reading a Hopper's) would take
the nearest card's row untimed, tuned for another card's bandwidth and SM count. Instead, on the
first call of each regime, it times a short list: what each card's table picked for that regime
(the nearest row of each card, nearest card first) and the heuristic's default, each compiled
and checked against the device's shared memory first (a config that does not fit is never run),
at most :data:`MAX_CANDIDATES` of them, each timed briefly (:data:`WARMUP_MS` of warm-up,
:data:`REPETITION_MS` of repetitions), and no new candidate started after :data:`TIME_BUDGET_S`
seconds. The fastest is kept in the on-disk tuning cache (:mod:`triton_dispatch.tuning_cache`),
so later processes on that card reuse it without timing anything.

``TRITON_DISPATCH_BOUNDED_TUNE=0`` turns it off (the nearest card's row is taken untimed, as the
interpreter and CPU paths always do); full autotuning (``TRITON_DISPATCH_AUTOTUNE``) replaces it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .launch_configs import same_config
from .table_rows import RankedRow

__all__ = [
    "BOUNDED_TUNE_ENV_VAR",
    "MAX_CANDIDATES",
    "REPETITION_MS",
    "TIME_BUDGET_S",
    "WARMUP_MS",
    "bounded_tune_enabled",
    "brief_do_bench",
    "card_picks",
    "fastest",
    "short_list",
]

#: ``0`` turns the first-call short tune off (on by default, on GPUs only).
BOUNDED_TUNE_ENV_VAR = "TRITON_DISPATCH_BOUNDED_TUNE"
#: The most configs one regime's short tune times (the heuristic's default among them).
MAX_CANDIDATES = 5
#: Seconds (compiles included) after which no further candidate is started.
TIME_BUDGET_S = 10.0
#: Warm-up and repetition time of one candidate, in milliseconds: Triton's autotuner takes 25
#: and 100; configs that differ by tens of percent separate in far less.
WARMUP_MS = 5
REPETITION_MS = 20


def bounded_tune_enabled() -> bool:
    """Whether :data:`BOUNDED_TUNE_ENV_VAR` leaves the short tune on (the default)."""
    value = os.environ.get(BOUNDED_TUNE_ENV_VAR, "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def card_picks(rows: Iterable[tuple[Any, RankedRow]]) -> list:
    """Each card's pick for a regime, nearest card first: the config of the first of its rows
    in ``rows``, ``(config, row)`` pairs in the order the running card reads them
    (:func:`~triton_dispatch.table_rows.rows_by_nearness`)."""
    seen: set[str] = set()
    picks = []
    for config, ranked in rows:
        if ranked.card.slug not in seen:
            seen.add(ranked.card.slug)
            picks.append(config)
    return picks


def short_list(picks: Iterable[Any], default: Any, *, limit: int | None = None) -> list:
    """The configs to time: ``picks`` in order (the tables' picks, nearest card first), each
    once, cut so that ``default`` (the heuristic's) is among at most ``limit`` configs (default
    :data:`MAX_CANDIDATES`)."""
    limit = MAX_CANDIDATES if limit is None else limit
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    chosen: list = []
    for config in picks:
        if not any(same_config(config, c) for c in chosen):
            chosen.append(config)
    head = chosen[:limit]
    if any(same_config(default, c) for c in head):
        return head
    rest = [c for c in chosen if not same_config(default, c)]
    return [*rest[: limit - 1], default]


def fastest(
    candidates: Sequence[Any],
    time_one: Callable[[Any], float | None],
    *,
    budget_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[Any, float, list[tuple[Any, float]]] | None:
    """Time ``candidates`` in order with ``time_one(config) -> ms`` (``None`` or a non-finite
    time: it cannot run here) until they are done or ``budget_s`` seconds (default
    :data:`TIME_BUDGET_S`) have passed (the one being timed finishes; the first is always
    timed). Returns ``(fastest, its ms, every (config, ms) timed)``, or ``None`` when none could
    be timed."""
    budget_s = TIME_BUDGET_S if budget_s is None else budget_s
    start = clock()
    timed: list[tuple[Any, float]] = []
    for i, config in enumerate(candidates):
        if i and clock() - start >= budget_s:
            break
        ms = time_one(config)
        if ms is not None and math.isfinite(ms):
            timed.append((config, float(ms)))
    if not timed:
        return None
    best, ms = min(timed, key=lambda item: item[1])
    return best, ms, timed


def brief_do_bench(kernel_call: Callable[[], Any], quantiles: Sequence[float]) -> Any:
    """Triton's ``do_bench`` with this module's short warm-up and repetitions."""
    import triton.testing

    return triton.testing.do_bench(
        kernel_call, warmup=WARMUP_MS, rep=REPETITION_MS, quantiles=list(quantiles)
    )
