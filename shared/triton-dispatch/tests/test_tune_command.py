"""``python -m triton_dispatch.tune`` on a simulated card: the per-card table it writes, merges
and replaces. The package is a stand-in whose ``warmup()`` records made-up tuning results."""

import gc
import json
import sys

import pytest
import torch

from triton_dispatch import set_autotune, tune
from triton_dispatch.cards import known_card
from triton_dispatch.device import DeviceFacts, simulated_device
from triton_dispatch.launch_configs import parse_table, table_problems
from triton_dispatch.tuning_cache import CACHE_ENV_VAR

PACKAGE = "fake_tuned_kernels"
H200 = known_card("NVIDIA H200")

WARMUP = """
from types import SimpleNamespace

import triton

from triton_dispatch import autotune_mode

TUNING_SHAPES = ["64", "4096"]
KERNELS = []


class Kernel:
    package, name = "fake_tuned_kernels", "scale_kernel"

    def __init__(self):
        self.tuned = {}


def warmup(shapes, device):
    if not KERNELS:
        KERNELS.append(Kernel())
        autotune_mode.register(KERNELS[0])
    for shape in shapes:
        key = (("N", int(shape)), ("X", "torch.float32"))
        config = triton.Config({"BLOCK": min(int(shape), 256)}, num_warps=4, num_stages=2)
        KERNELS[0].tuned[key] = (config, 0.01)
    return SimpleNamespace(seconds=0.0, compiled=0)
"""


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """The stand-in package's table folder; the command sees a GPU."""
    root = tmp_path / PACKAGE
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "warmup.py").write_text(WARMUP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(CACHE_ENV_VAR, "1")  # the command turns it off; restored afterwards
    yield root / "launch_configs"
    set_autotune(None, PACKAGE)
    for name in (PACKAGE, f"{PACKAGE}.warmup"):
        sys.modules.pop(name, None)
    gc.collect()  # the stand-in kernels leave the registry (it holds them weakly)


def _rows(path):
    data = json.loads(path.read_text())
    return data, [(r["key"]["N"], r["card"]) for r in data["kernels"]["scale_kernel"]]


def test_the_tune_command_writes_the_table_of_the_card_it_runs_on(tables):
    earlier = {"card": H200.name, "family": "sm90", "kernels": {"scale_kernel": [
        {"key": {"N": 128, "X": "torch.float32"}, "config": {"kwargs": {"BLOCK": 128}},
         "card": H200.name}]}}  # fmt: skip
    tables.mkdir()
    (tables / "h200.json").write_text(json.dumps(earlier))
    with simulated_device(H200.facts()):
        assert tune.main([PACKAGE, "--shape", "64"]) == 0
    data, rows = _rows(tables / "h200.json")
    assert sorted(rows) == [(64, H200.name), (128, H200.name)]  # merged into the earlier rows
    assert (data["card"], data["family"]) == (H200.name, "sm90")
    assert data["card_facts"]["memory_bandwidth_gbs"] == H200.memory_bandwidth_gbs
    assert {"date", "triton", "torch"} <= set(data)
    assert data["command"].endswith(f"{PACKAGE} --shape 64")
    assert table_problems(data, "h200") == []
    with simulated_device(H200.facts()):
        assert tune.main([PACKAGE, "--shape", "64", "--replace"]) == 0
    assert _rows(tables / "h200.json")[1] == [(64, H200.name)]


def test_a_card_the_registry_does_not_know_gets_a_table_that_describes_it(tables):
    h800 = DeviceFacts("NVIDIA H800", (9, 0), 132, 232_448, 0, memory_bandwidth_gbs=3352.3)
    with simulated_device(h800):
        assert tune.main([PACKAGE]) == 0  # the package's TUNING_SHAPES
    data, rows = _rows(tables / "h800.json")
    assert sorted(rows) == [(64, "NVIDIA H800"), (4096, "NVIDIA H800")]
    assert table_problems(data, "h800") == []
    card = parse_table(data, "h800").card
    assert (card.slug, card.capability, card.memory_bandwidth_gbs) == ("h800", (9, 0), 3352.3)


def test_robust_choice_keeps_the_config_with_the_smallest_worst_slowdown():
    a, b, c = (triton_config(block) for block in (32, 64, 128))
    # a wins the first shape by 10 % and loses the second by 50 %; b is 5 % off on both
    timings = [{a: 1.0, b: 1.05, c: 2.0}, {a: 3.0, b: 2.1, c: 2.0}]
    config, ms, worst = tune.robust_choice(timings)
    assert config.kwargs == b.kwargs and ms == 1.05 and worst == pytest.approx(1.05)
    # configs compared by what they are, not by object: a new object of b's config counts
    again = [{a: 1.0, b: 1.05}, {triton_config(64): 1.0, triton_config(32): 1.2}]
    assert tune.robust_choice(again)[0].kwargs == b.kwargs
    assert tune.robust_choice([{a: 1.0}, {c: 1.0}]) is None  # nothing timed on both
    assert tune.robust_choice([]) is None


def triton_config(block):
    import triton

    return triton.Config({"BLOCK": block}, num_warps=4, num_stages=2)


ROBUST_WARMUP = """
from types import SimpleNamespace

import triton

from triton_dispatch import autotune_mode

TUNING_SHAPES = ["small", "large"]
KERNELS = []
CONFIGS = {b: triton.Config({"BLOCK": b}, num_warps=4, num_stages=2) for b in (64, 128)}
# both shapes reach one regime: 64 is best on "small" by 2 %, 128 on "large" by 40 %
TIMES = {"small": {64: 1.0, 128: 1.02}, "large": {64: 1.4, 128: 1.0}}


class Kernel:
    package, name = "fake_tuned_kernels", "scale_kernel"

    def __init__(self):
        self.tuned, self.timings, self.forgotten = {}, {}, 0

    def forget_regimes(self):
        self.tuned.clear()
        self.forgotten += 1


def warmup(shapes, device):
    if not KERNELS:
        KERNELS.append(Kernel())
        autotune_mode.register(KERNELS[0])
    kernel = KERNELS[0]
    for shape in shapes:
        key = (("N", 32), ("X", "torch.float32"))
        if key in kernel.tuned:
            continue  # chosen already in this process: no benchmark
        timed = {CONFIGS[b]: ms for b, ms in TIMES[shape].items()}
        best = min(timed, key=timed.get)
        kernel.tuned[key] = (best, timed[best])
        kernel.timings.setdefault(key, []).append(timed)
    return SimpleNamespace(seconds=0.0, compiled=0)
"""


@pytest.mark.parametrize(("robust", "block"), [(False, 64), (True, 128)])
def test_robust_tuning_benchmarks_every_shape_of_a_regime(tables, robust, block, capsys):
    (tables.parent / "warmup.py").write_text(ROBUST_WARMUP)
    with simulated_device(H200.facts()):
        assert tune.main([PACKAGE] + (["--robust"] if robust else [])) == 0
    data = json.loads((tables / "h200.json").read_text())
    (row,) = data["kernels"]["scale_kernel"]
    # the first shape's winner alone, or the config at most 2 % off on both shapes
    assert row["config"]["kwargs"] == {"BLOCK": block}
    kernel = sys.modules[f"{PACKAGE}.warmup"].KERNELS[0]
    assert len(kernel.timings[(("N", 32), ("X", "torch.float32"))]) == (2 if robust else 1)
    # the regime two shapes reached, and how far its row is from each shape's best
    assert ("2 shapes, worst 1.020x their best" in capsys.readouterr().out) is robust
