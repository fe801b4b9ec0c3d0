"""The first-call short tune of a card without rows of its own, on a simulated card: compiles
return made-up shared memory, trials return made-up times, so no GPU is needed."""

import time
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

import triton_dispatch.tuned_kernel as tk
from triton_dispatch import autotune, benchmark_count, bounded_tune, set_autotune, tuning_cache
from triton_dispatch import launch_configs as lc
from triton_dispatch.cards import describe_card, known_card
from triton_dispatch.device import simulated_device

SPACE = [triton.Config({"BLOCK": b}, num_warps=w, num_stages=2) for b in (32, 64, 128)
         for w in (4, 8)]  # fmt: skip
DEFAULT = triton.Config({"BLOCK": 64}, num_warps=4, num_stages=2)
RTX_5090 = known_card("NVIDIA GeForce RTX 5090")  # 99 KB of shared memory per block
SHARED = {32: 20_000, 64: 40_000, 128: 120_000}  # bytes per BLOCK: 128 does not fit a 5090
# each card's pick for the regime (N_BUCKET 1024, fp32), and how fast each config runs
PICKS = {
    "NVIDIA H100 80GB HBM3": (128, 8),
    "NVIDIA H200": (64, 8),
    "NVIDIA A100-SXM4-80GB": (32, 4),
}
MS = {(32, 4): 3.0, (32, 8): 3.5, (64, 4): 2.0, (64, 8): 1.0, (128, 4): 0.8, (128, 8): 0.5}


@triton.jit
def _copy_kernel(X, Y, n, N_BUCKET, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)


def _table(name, block, warps, n_bucket=1024):
    card = known_card(name)
    row = {"key": {"N_BUCKET": n_bucket, "X": "torch.float32", "Y": "torch.float32"},
           "config": {"kwargs": {"BLOCK": block}, "num_warps": warps, "num_stages": 2},
           "ms": MS[(block, warps)], "card": name}  # fmt: skip
    data = {"card": name, "family": card.family, "card_facts": describe_card(card),
            "kernels": {"_copy_kernel": [row]}}  # fmt: skip
    return lc.parse_table(data, card.slug)


TABLES = [_table(name, *pick) for name, pick in PICKS.items()]


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty tuning cache, the short tune on at its defaults, autotuning off."""
    monkeypatch.setenv(tuning_cache.CACHE_DIR_ENV_VAR, str(tmp_path))
    for name in (bounded_tune.BOUNDED_TUNE_ENV_VAR, "TRITON_DISPATCH_AUTOTUNE",
                 "FAKE_KERNELS_AUTOTUNE", tuning_cache.CACHE_ENV_VAR):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _on_a_gpu(monkeypatch, tables=TABLES):
    """The copy kernel of package ``fake_kernels`` built as on a GPU (its whole space), reading
    ``tables``: launches are recorded, a compile returns ``SHARED[BLOCK]`` bytes, a trial is
    recorded and returns ``MS[(BLOCK, num_warps)]``."""
    monkeypatch.setattr(tk, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(lc, "package_tables", lambda pkg: tables if pkg == "fake_kernels" else [])
    kernel = autotune(SPACE, key=["N_BUCKET"], default=DEFAULT)(_copy_kernel)
    kernel.package = "fake_kernels"
    launched, timed = [], []

    def run(*args, warmup=False, **kw):
        if warmup:
            return SimpleNamespace(metadata=SimpleNamespace(shared=SHARED[kw["BLOCK"]]))
        launched.append((kw["BLOCK"], kw["num_warps"]))

    def trial(*args, config, **meta):
        tk.autotune_mode.count_benchmark()
        timed.append((config.kwargs["BLOCK"], config.num_warps))
        return [MS[timed[-1]]] * 3

    monkeypatch.setattr(kernel.fn, "run", run, raising=False)
    monkeypatch.setattr(kernel, "_bench", trial)
    return kernel, launched, timed


def _first_call(kernel, card=RTX_5090):
    x, y = torch.zeros(8), torch.zeros(8)
    with simulated_device(card.facts()):
        kernel[(1,)](x, y, 8, 1024)


def test_a_card_without_a_table_times_a_short_list_that_fits_it_and_keeps_the_pick(
    fresh, monkeypatch
):
    """An RTX 5090 has no table: its first call times each card's pick (nearest card first:
    the A100's bandwidth is nearest, then the H100's, the H200's) and the default, passing over
    the H100's pick (120 KB does not fit 99 KB) without running it; the fastest that fits (the
    H200's) launches, and a restarted process takes it from disk without timing anything."""
    kernel, launched, timed = _on_a_gpu(monkeypatch)
    start = time.perf_counter()
    _first_call(kernel)
    assert time.perf_counter() - start < 5
    assert timed == [(32, 4), (64, 8), (64, 4)]  # the A100's, the H200's, the default
    assert all(SHARED[block] <= RTX_5090.shared_memory_per_block for block, _ in timed)
    assert launched == [(64, 8)] and list(kernel.sources.values()) == ["bounded"]
    [(config, shared)] = next(iter(kernel.too_large.values()))
    assert (config.kwargs["BLOCK"], config.num_warps, shared) == (128, 8, 120_000)
    assert len(list(fresh.glob("*.json"))) == 1
    assert not kernel.tuned  # a pick among a few is no table row for the tuning command
    # a new process on the same card: the kept pick, nothing timed
    again, launched, timed = _on_a_gpu(monkeypatch)
    before = benchmark_count()
    _first_call(again)
    assert launched == [(64, 8)] and list(again.sources.values()) == ["cache"]
    assert timed == [] and benchmark_count() == before


def test_a_compile_ahead_leaves_the_short_tune_to_the_first_real_call(fresh, monkeypatch):
    """A compile ahead runs the kernel with stand-in tensors and launches nothing, so it cannot
    time trials: on a card without a table it compiles nothing, keeps no pick, stores nothing,
    and the first real call then runs the short tune."""
    kernel, launched, timed = _on_a_gpu(monkeypatch)
    x, y = torch.zeros(0), torch.zeros(0)
    with simulated_device(RTX_5090.facts()):
        assert kernel.run(x, y, 8, 1024, grid=(1,), warmup=True) is None
    assert timed == [] and launched == [] and not kernel.cache and not kernel.sources
    assert list(fresh.glob("*.json")) == []
    _first_call(kernel)
    assert timed == [(32, 4), (64, 8), (64, 4)] and launched == [(64, 8)]
    assert list(kernel.sources.values()) == ["bounded"]


def test_the_short_tune_is_bounded_in_candidates_and_time(fresh, monkeypatch):
    """Six cards' tables, five picks: the 5090 takes the four nearest (cards within its 99 KB
    first: the RTX 4090, L40S, A10, L4; the A100's pick is left out) and the default, and times
    the three that fit."""
    names = ["NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090", "NVIDIA L40S", "NVIDIA L4",
             "NVIDIA A10", "NVIDIA H200"]  # fmt: skip
    picks = [(32, 4), (32, 8), (128, 4), (128, 8), (64, 8), (32, 8)]
    kernel, _, timed = _on_a_gpu(monkeypatch, [_table(n, *p) for n, p in zip(names, picks)])
    _first_call(kernel)
    assert bounded_tune.MAX_CANDIDATES == 5 and timed == [(32, 8), (64, 8), (64, 4)]
    # no time left after the first trial: no second one, and nothing kept from one trial
    monkeypatch.setattr(bounded_tune, "TIME_BUDGET_S", 0.0)
    kernel, launched, timed = _on_a_gpu(monkeypatch)
    _first_call(kernel)
    assert timed == [(32, 4)] and len(list(fresh.glob("*.json"))) == 1  # the first part's
    assert launched == [(32, 4)] and list(kernel.sources.values()) == ["borrowed"]


def test_cards_with_rows_of_their_own_under_the_interpreter_or_opted_out_time_nothing(
    fresh, monkeypatch
):
    kernel, launched, timed = _on_a_gpu(monkeypatch)
    _first_call(kernel, known_card("NVIDIA H200"))  # its own row: today's instant path
    assert timed == [] and launched == [(64, 8)] and list(kernel.sources.values()) == ["table"]
    monkeypatch.setenv(bounded_tune.BOUNDED_TUNE_ENV_VAR, "0")
    kernel, launched, timed = _on_a_gpu(monkeypatch)
    _first_call(kernel)  # the nearest card's row that fits, untimed
    assert timed == [] and launched == [(32, 4)] and list(kernel.sources.values()) == ["borrowed"]
    monkeypatch.delenv(bounded_tune.BOUNDED_TUNE_ENV_VAR)
    kernel, launched, timed = _on_a_gpu(monkeypatch)
    monkeypatch.setattr(tk, "interpreter_enabled", lambda: True)
    _first_call(kernel)
    assert timed == [] and list(fresh.glob("*.json")) == []


def test_new_tables_and_full_autotuning_set_a_kept_pick_aside(fresh, monkeypatch):
    kernel, _, _ = _on_a_gpu(monkeypatch)
    _first_call(kernel)
    # a package update whose tables differ: the short list is timed again
    tables = [*TABLES, _table("NVIDIA GeForce RTX 4090", 32, 8)]
    kernel, _, timed = _on_a_gpu(monkeypatch, tables)
    _first_call(kernel)
    assert (32, 8) in timed and list(kernel.sources.values()) == ["bounded"]
    set_autotune(True, "fake_kernels")
    try:  # the whole space that fits is measured, not the short list's pick reused
        kernel, _, timed = _on_a_gpu(monkeypatch)
        _first_call(kernel)
    finally:
        set_autotune(None, "fake_kernels")
    assert sorted(timed) == [(32, 4), (32, 8), (64, 4), (64, 8)]
    assert list(kernel.sources.values()) == ["benchmark"]


def test_short_list():
    a, b, c, d = (triton.Config({"BLOCK": v}) for v in (16, 32, 64, 128))
    same_as_a = triton.Config({"BLOCK": 16})

    def pick(*configs, **kw):
        return [x.kwargs["BLOCK"] for x in bounded_tune.short_list(*configs, **kw)]

    assert pick([a, same_as_a, b], c) == [16, 32, 64]
    assert pick([a, b, c, d], d, limit=2) == [16, 128]  # the default always among them
    assert pick([a, b, c], b, limit=2) == [16, 32]
    assert pick([], a) == [16]
    with pytest.raises(ValueError, match="limit"):
        bounded_tune.short_list([a], b, limit=0)


def test_fastest_stops_starting_trials_once_the_budget_is_spent():
    now = [0.0]

    def time_one(ms):
        now[0] += 4.0  # every trial takes 4 s
        return ms

    best = bounded_tune.fastest([3.0, None, 1.0, 0.5], time_one, budget_s=10, clock=lambda: now[0])
    assert best == (1.0, 1.0, [(3.0, 3.0), (1.0, 1.0)])  # the fourth would start at 12 s
    assert bounded_tune.fastest([None, float("inf")], lambda ms: ms, budget_s=10) is None


def test_the_switch(monkeypatch):
    monkeypatch.delenv(bounded_tune.BOUNDED_TUNE_ENV_VAR, raising=False)
    assert bounded_tune.bounded_tune_enabled()
    for off in ("0", "false", "OFF"):
        monkeypatch.setenv(bounded_tune.BOUNDED_TUNE_ENV_VAR, off)
        assert not bounded_tune.bounded_tune_enabled()
