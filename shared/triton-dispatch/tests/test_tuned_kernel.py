"""Config selection without benchmarks: tables, nearest rows, the heuristic, the autotune switch,
and the autotuning results kept on disk."""

import json
import subprocess
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from triton_dispatch import autotune, autotune_enabled, benchmark_count, set_autotune, tuning_cache
from triton_dispatch import launch_configs as lc
from triton_dispatch.selfcheck import column_sums
from triton_dispatch.testing import assert_close, randn

SPACE = [
    triton.Config({"BLOCK": b}, num_warps=w, num_stages=s)
    for b in (32, 64, 128)
    for w in (4, 8)
    for s in (2, 3)
]
DEFAULT = triton.Config({"BLOCK": 64}, num_warps=4, num_stages=3)


@triton.jit
def _scale_kernel(X, Y, n, N_BUCKET, FLAG: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n) * 2, mask=offs < n)


H100 = "NVIDIA H100 80GB HBM3"


def _kernel(monkeypatch, rows, *, default=DEFAULT, prune=None):
    """The scale kernel of package ``fake_kernels``, whose one table is an H100's."""
    kernel = autotune(SPACE, key=["N_BUCKET", "FLAG"], default=default, prune=prune)(_scale_kernel)
    kernel.package = "fake_kernels"
    data = {"card": H100, "family": "sm90", "kernels": {"_scale_kernel": rows}}
    tables = [lc.parse_table(data, "h100")] if rows else []
    monkeypatch.setattr(lc, "package_tables", lambda pkg: tables if pkg == "fake_kernels" else [])
    return kernel


def _row(n_bucket, flag, block, warps=4, stages=2, dtype="torch.float32"):
    return {
        "key": {"N_BUCKET": n_bucket, "FLAG": flag, "X": dtype, "Y": dtype},
        "config": {"kwargs": {"BLOCK": block}, "num_warps": warps, "num_stages": stages},
        "card": H100,
    }


def _key(n_bucket, flag, dtype=torch.float32):
    return {"N_BUCKET": n_bucket, "FLAG": flag, "X": dtype, "Y": dtype}


def test_exact_row_then_nearest_row_then_heuristic(monkeypatch):
    rows = [_row(1024, False, 128, 8, 3), _row(64, False, 32), _row(1024, True, 64, 8, 2)]
    kernel = _kernel(monkeypatch, rows)
    config, source = kernel.select(_key(1024, False), (9, 0))
    assert source == "table" and config.kwargs == {"BLOCK": 128} and config.num_warps == 8
    # 4096 is two powers of two from 1024 and six from 64: the 1024 row wins
    config, source = kernel.select(_key(4096, False), (9, 0))
    assert source == "nearest" and config.kwargs == {"BLOCK": 128}
    config, _ = kernel.select(_key(128, False), (9, 0))
    assert config.kwargs == {"BLOCK": 32}
    # a flag that differs costs more than any size: the row with the same flag wins
    config, _ = kernel.select(_key(64, True), (9, 0))
    assert config.kwargs == {"BLOCK": 64} and config.num_warps == 8
    # no table for this card: the nearest card's rows
    config, source = kernel.select(_key(1024, False), (8, 0))
    assert source == "borrowed" and config.kwargs == {"BLOCK": 128} and config.num_warps == 8
    # no rows for this kernel anywhere: the declared default
    config, source = _kernel(monkeypatch, []).select(_key(1024, False), (8, 0))
    assert source == "heuristic" and lc.same_config(config, DEFAULT)


def test_rows_outside_the_space_or_the_device_limits_are_passed_over(monkeypatch):
    stale = _row(1024, False, 256)  # a block size the space no longer has
    kernel = _kernel(monkeypatch, [stale, _row(256, False, 128, 8, 3)])
    config, source = kernel.select(_key(1024, False), (9, 0))
    assert source == "nearest" and config.kwargs == {"BLOCK": 128}
    # a device that cannot fit 128-wide blocks: the candidates exclude it, the default stays
    small = [c for c in SPACE if c.kwargs["BLOCK"] < 128]
    config, source = kernel.select(_key(1024, False), (9, 0), small)
    assert source == "heuristic" and lc.same_config(config, DEFAULT)


def test_heuristic_keeps_near_the_default_and_shallow_before_ampere(monkeypatch):
    kernel = _kernel(monkeypatch, [])
    no_64 = [c for c in SPACE if c.kwargs["BLOCK"] != 64]
    config, _ = kernel.select(_key(1024, False), (8, 0), no_64)
    assert config.num_warps == 4 and config.num_stages == 3  # only the block size moved
    config, _ = kernel.select(_key(1024, False), (7, 5))
    assert config.kwargs == {"BLOCK": 64} and config.num_stages == 2
    chosen = _kernel(monkeypatch, [], default=lambda args: SPACE[-1])
    assert lc.same_config(chosen.select(_key(1, False), (8, 0))[0], SPACE[-1])
    first = _kernel(monkeypatch, [], default=None)
    assert lc.same_config(first.select(_key(1, False), (8, 0))[0], SPACE[0])


def test_key_distance_and_nearest_rows():
    a = {"N": 1024, "F": True, "X": "torch.bfloat16"}
    assert lc.key_distance(a, dict(a)) == 0
    assert lc.key_distance(a, {**a, "N": 256}) == 2
    assert lc.key_distance(a, {**a, "F": False}) > lc.key_distance(a, {**a, "N": 1})
    assert lc.key_distance(a, {"N": 1024}) == float("inf")
    rows = [{"key": {**a, "N": 64}}, {"key": {**a, "N": 2048}}, {"key": {"other": 1}}]
    assert [r["key"]["N"] for r in lc.nearest_rows(rows, a)] == [2048, 64]


def test_malformed_tables_are_ignored_with_a_warning():
    with pytest.warns(RuntimeWarning, match="ignoring launch-config table"):
        assert lc.validate_table({"kernels": {"k": "not rows"}}, "x.json") == {}
    with pytest.warns(RuntimeWarning):
        assert lc.validate_table([], "x.json") == {}
    assert lc.load_table("json", "sm90") is None  # a package without tables


def test_config_json_round_trip():
    config = triton.Config({"BLOCK": 64, "FLAG": True}, num_warps=8, num_stages=4, maxnreg=128)
    back = lc.config_from_json(json.loads(json.dumps(lc.config_to_json(config))))
    assert lc.same_config(config, back)
    with pytest.raises(ValueError):
        lc.config_from_json({"num_warps": 4})


def test_autotune_switch(monkeypatch):
    monkeypatch.delenv("TRITON_DISPATCH_AUTOTUNE", raising=False)
    monkeypatch.delenv("FAKE_KERNELS_AUTOTUNE", raising=False)
    assert not autotune_enabled("fake_kernels")
    monkeypatch.setenv("TRITON_DISPATCH_AUTOTUNE", "1")
    assert autotune_enabled("fake_kernels")
    monkeypatch.setenv("TRITON_DISPATCH_AUTOTUNE", "other_kernels, fake_kernels")
    assert autotune_enabled("fake_kernels") and not autotune_enabled("third")
    monkeypatch.setenv("FAKE_KERNELS_AUTOTUNE", "0")
    assert not autotune_enabled("fake_kernels")
    try:
        set_autotune(True, "fake_kernels")
        assert autotune_enabled("fake_kernels")
        set_autotune(False)
        assert autotune_enabled("fake_kernels")  # the package's own override comes first
        assert not autotune_enabled("third")
    finally:
        set_autotune(None, "fake_kernels")
        set_autotune(None)
    assert not autotune_enabled("fake_kernels")


def test_default_path_never_benchmarks():
    before = benchmark_count()
    x = randn((70, 40))
    assert_close(column_sums(x), x.double().sum(0), dtype=torch.float32)
    assert benchmark_count() == before


IDENT = {"kernel": "pkg.k", "device": "H100 sm90", "triton": "3.6.0", "source": "abc", "space": "s"}

_READ_BACK = """
import json, sys
from triton_dispatch import tuning_cache
ident = json.loads(sys.argv[1])
found = tuning_cache.load(ident)
print(json.dumps({k: [c.kwargs, c.num_warps, ms] for k, (c, ms) in found.items()}))
"""


def test_cache_round_trip_across_processes(tmp_path, monkeypatch):
    monkeypatch.setenv(tuning_cache.CACHE_DIR_ENV_VAR, str(tmp_path))
    key = {"N_BUCKET": 1024, "FLAG": True, "X": "torch.float32"}
    tuning_cache.store(IDENT, key, triton.Config({"BLOCK": 64}, num_warps=8), 0.0123)
    tuning_cache.store(IDENT, {**key, "N_BUCKET": 64}, triton.Config({"BLOCK": 32}), None)
    proc = subprocess.run(
        [sys.executable, "-c", _READ_BACK, json.dumps(IDENT)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found[tuning_cache.key_string(key)] == [{"BLOCK": 64}, 8, 0.0123]
    assert len(found) == 2
    # another Triton version (or device, or kernel source) reads another file: nothing
    assert tuning_cache.load({**IDENT, "triton": "3.7.0"}) == {}


def test_corrupt_or_foreign_cache_files_are_ignored_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv(tuning_cache.CACHE_DIR_ENV_VAR, str(tmp_path))
    key = {"N": 1}
    tuning_cache.store(IDENT, key, triton.Config({"BLOCK": 64}), 1.0)
    (path,) = tmp_path.glob("*.json")
    path.write_text("{not json")
    with pytest.warns(RuntimeWarning, match="corrupt"):
        assert tuning_cache.load(IDENT) == {}
    path.write_text(json.dumps({"format": 1, "identity": {**IDENT, "triton": "9"}, "entries": []}))
    with pytest.warns(RuntimeWarning, match="another kernel or Triton"):
        assert tuning_cache.load(IDENT) == {}
    # a corrupt file is replaced by the next result, not a crash
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tuning_cache.store(IDENT, key, triton.Config({"BLOCK": 32}), 2.0)
    assert tuning_cache.load(IDENT)[tuning_cache.key_string(key)][0].kwargs == {"BLOCK": 32}
    monkeypatch.setenv(tuning_cache.CACHE_ENV_VAR, "0")
    assert tuning_cache.load(IDENT) == {}


def _gpu_style_kernel(monkeypatch, launched, shared=lambda kw: 0, default=DEFAULT):
    """A TunedKernel built as on a GPU (the whole space runs), whose launches are recorded
    instead of run, whose compiles (``warmup=True``) return a kernel of ``shared(kwargs)`` bytes
    of shared memory, and whose autotune trials return made-up timings (BLOCK 128, 8 warps
    wins)."""
    import triton_dispatch.tuned_kernel as tk

    monkeypatch.setattr(tk, "interpreter_enabled", lambda: False)
    kernel = autotune(SPACE, key=["N_BUCKET", "FLAG"], default=default)(_scale_kernel)
    kernel.package = "fake_kernels"

    def run(*args, warmup=False, **kw):
        if warmup:
            return SimpleNamespace(metadata=SimpleNamespace(shared=shared(kw)))
        launched.append(kw)

    monkeypatch.setattr(kernel.fn, "run", run, raising=False)

    def trial(*args, config, **meta):
        tk.autotune_mode.count_benchmark()
        fast = config.kwargs["BLOCK"] == 128 and config.num_warps == 8 and config.num_stages == 2
        return [0.5 if fast else 1.0] * 3

    monkeypatch.setattr(kernel, "_bench", trial)
    return kernel


def test_opt_in_autotuning_benchmarks_once_and_a_new_process_reads_the_result(tmp_path, monkeypatch):
    monkeypatch.setenv(tuning_cache.CACHE_DIR_ENV_VAR, str(tmp_path))
    monkeypatch.setattr(lc, "package_tables", lambda pkg: [])
    x, y = torch.zeros(8), torch.zeros(8)
    launched: list[dict] = []
    set_autotune(True, "fake_kernels")
    try:
        kernel = _gpu_style_kernel(monkeypatch, launched)
        before = benchmark_count()
        kernel[(1,)](x, y, 8, 1024, FLAG=False)
        kernel[(1,)](x, y, 8, 1024, FLAG=False)  # the same regime: no new trials
        assert benchmark_count() - before == len(SPACE)
        assert [kw["BLOCK"] for kw in launched] == [128, 128] and launched[0]["num_warps"] == 8
        assert list(kernel.sources.values()) == ["benchmark"]
        assert len(list(tmp_path.glob("*.json"))) == 1
    finally:
        set_autotune(None, "fake_kernels")
    # a restarted process (a new kernel object, autotuning off) takes the stored result
    launched.clear()
    again = _gpu_style_kernel(monkeypatch, launched)
    before = benchmark_count()
    again[(1,)](x, y, 8, 1024, FLAG=False)
    assert benchmark_count() == before
    assert launched[0]["BLOCK"] == 128 and list(again.sources.values()) == ["cache"]
    # another regime, autotuning off: no trial, the heuristic (no table here)
    again[(1,)](x, y, 8, 64, FLAG=True)
    assert benchmark_count() == before and launched[1]["BLOCK"] == 64


def test_forgetting_the_regimes_benchmarks_them_again_and_keeps_every_timing(tmp_path, monkeypatch):
    monkeypatch.setenv(tuning_cache.CACHE_ENV_VAR, "0")
    monkeypatch.setattr(lc, "package_tables", lambda pkg: [])
    x, y = torch.zeros(8), torch.zeros(8)
    set_autotune(True, "fake_kernels")
    try:
        kernel = _gpu_style_kernel(monkeypatch, [])
        kernel[(1,)](x, y, 8, 1024, FLAG=False)
        (key,) = kernel.tuned
        before = benchmark_count()
        kernel.forget_regimes()
        assert kernel.tuned == {} and kernel.sources == {}
        kernel[(1,)](x, y, 8, 1024, FLAG=False)  # the same regime, benchmarked again
        assert benchmark_count() - before == len(SPACE)
        assert len(kernel.timings[key]) == 2
        assert all(len(t) == len(SPACE) for t in kernel.timings[key])
    finally:
        set_autotune(None, "fake_kernels")


def test_benchmark_json_names_each_regimes_config(monkeypatch, tmp_path):
    """What ``tools/gpu/table_vs_autotune.py`` compares between its two runs of a script: the
    config each regime took (on a GPU the first call fills the kernel's regime cache; the
    interpreter runs one config and keeps none, so the test selects as that call would)."""
    from triton_dispatch.bench import BenchRecord, tuned_choices, write_json

    kernel = _kernel(monkeypatch, [_row(1024, False, 128, 8, 3)])
    named = _key(1024, False)
    regime = kernel.regime_key({**named, "X": torch.zeros(1), "Y": torch.zeros(1)})
    kernel.cache[regime] = kernel.select(named, (9, 0))[0]
    picks = tuned_choices()["fake_kernels._scale_kernel"]
    ((text, config),) = picks.items()
    assert json.loads(text) == {"N_BUCKET": 1024, "FLAG": False, "X": "torch.float32",
                                "Y": "torch.float32"}  # fmt: skip
    settings = json.loads(config)
    assert (settings["BLOCK"], settings["num_warps"], settings["num_stages"]) == (128, 8, 3)
    path = write_json([BenchRecord("x", {}, "none", None, 1.0)], tmp_path / "r.json")
    assert json.loads(path.read_text())["choices"]["fake_kernels._scale_kernel"] == picks
