import json

import pytest
import torch

from triton_dispatch import DeviceFacts, device_facts
from triton_dispatch.bench import (
    BenchRecord,
    compare,
    environment,
    format_table,
    median_ms,
    write_json,
)


def test_host_facts_are_cached():
    facts = device_facts("cpu")
    assert isinstance(facts, DeviceFacts) and facts.capability == (0, 0)
    assert facts is device_facts(torch.device("cpu")) and facts.shared_memory_per_block > 0


def test_median_on_host_is_positive():
    assert median_ms(lambda: sum(range(1000)), warmup=5, rep=30) > 0


def test_compare_records_ratio_and_survives_a_failing_baseline(tmp_path):
    def broken():
        raise MemoryError("too big")

    rec = compare(
        "sum",
        {"n": 10},
        ours=lambda: torch.ones(10).sum(),
        baseline=broken,
        baseline_name="boom",
        warmup=5,
        rep=30,
    )
    assert (
        rec.baseline_ms is None
        and rec.ratio is None
        and "MemoryError" in rec.extra["baseline_error"]
    )
    ok = BenchRecord("x", {"n": 1}, "einsum", baseline_ms=2.0, ours_ms=0.5)
    assert ok.ratio == 4.0
    table = format_table([rec, ok])
    assert "4.00x" in table and "einsum" in table
    path = write_json([ok], tmp_path / "r.json", meta={"command": "python bench.py"})
    data = json.loads(path.read_text())
    assert data["records"][0]["ratio"] == 4.0 and data["meta"]["command"] == "python bench.py"


def test_baselines_can_be_switched_off(monkeypatch):
    from triton_dispatch.bench import BASELINES_ENV_VAR

    calls = []
    monkeypatch.setenv(BASELINES_ENV_VAR, "0")
    rec = compare("sum", {"n": 3}, ours=lambda: torch.ones(3).sum(),
                  baseline=lambda: calls.append(1), baseline_name="never", warmup=2, rep=5)  # fmt: skip
    assert calls == [] and rec.baseline_ms is None and rec.extra["baseline_skipped"]
    assert rec.ours_ms > 0
    monkeypatch.setenv(BASELINES_ENV_VAR, "1")
    rec = compare("sum", {"n": 3}, ours=lambda: torch.ones(3).sum(),
                  baseline=lambda: calls.append(1), baseline_name="runs", warmup=2, rep=5)  # fmt: skip
    assert calls and rec.baseline_ms is not None and "baseline_skipped" not in rec.extra


def test_environment_has_versions():
    env = environment("cpu")
    assert {"device", "torch", "triton", "date"} <= set(env)


@pytest.mark.gpu
def test_cuda_facts_and_timing():
    facts = device_facts(0)
    assert (
        facts.capability >= (7, 0)
        and facts.sm_count > 0
        and facts.shared_memory_per_block >= 48 * 1024
    )
    x = torch.randn(1 << 20, device="cuda")
    rec = compare(
        "copy",
        {"n": x.numel()},
        ours=lambda: x * 2,
        baseline=lambda: x.clone(),
        baseline_name="clone",
        device="cuda",
    )
    assert rec.ours_ms > 0 and rec.ours_peak_bytes >= 4 << 20


@pytest.mark.gpu
def test_graph_timing_sees_the_kernels_past_the_host(monkeypatch):
    """``TRITON_DISPATCH_BENCH_GRAPHS=1``: a call whose host work between its launches outlasts
    its kernels is timed as the replay of a graph of the call (the kernels' time, well under
    what ``do_bench`` sees); a call with a host sync inside cannot be captured and is timed as
    before."""
    import time

    from triton_dispatch.bench import median_ms

    x = torch.randn(1024, device="cuda")

    def call():
        x.add_(1.0)
        time.sleep(2e-4)  # host work between two launches of a few microseconds
        x.mul_(0.5)

    plain = median_ms(call, device="cuda")
    assert plain > 0.15
    monkeypatch.setenv("TRITON_DISPATCH_BENCH_GRAPHS", "1")
    graphed = median_ms(call, device="cuda")
    assert 0 < graphed < plain / 4
    assert median_ms(lambda: x.sum().item(), device="cuda") > 0


def test_graph_timing_is_a_cuda_setting(monkeypatch):
    monkeypatch.setenv("TRITON_DISPATCH_BENCH_GRAPHS", "1")
    assert median_ms(lambda: sum(range(100)), device="cpu", warmup=5, rep=30) > 0


def test_wall_time_per_call_counts_every_call():
    from triton_dispatch.bench import wall_ms_per_call

    calls = []
    ms = wall_ms_per_call(lambda: calls.append(1), calls=50, warmup=5)
    assert len(calls) == 55 and ms >= 0


def test_collective_timer_runs_the_same_count_everywhere_and_times_the_loop():
    from triton_dispatch.bench import collective_ms

    calls = []

    def step():
        calls.append(1)
        sum(range(2000))  # some host time to measure

    timed = collective_ms(step, calls=20, warmup=3)
    # warm-up, then the timed loop (the per-call event loop runs on CUDA only)
    assert len(calls) == 23
    assert set(timed) == {"gpu_ms", "loop_gpu_ms", "wall_ms"}
    assert all(v > 0 for v in timed.values())


def test_step_profile_names_the_python_work_of_a_step():
    from triton_dispatch.bench import format_profile, profile_step

    def busy_helper():
        return sum(i * i for i in range(5000))

    profile = profile_step(busy_helper, calls=5, warmup=1, python_top=5)
    assert profile["calls"] == 5 and profile["host_ms"] > 0
    functions = [row["function"] for row in profile["python"]]
    assert any("genexpr" in f or "busy_helper" in f for f in functions), functions
    assert all(row["per_call"] > 0 for row in profile["python"])
    text = format_profile("step", profile)
    assert text.startswith("step: host") and "us own" in text
