"""Triton's once-per-process start on a background thread (:mod:`triton_dispatch.prime`): when it
runs, what it does, and that a first compile waits for it instead of doing the work twice."""

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

import triton_dispatch.host_build as host_build
import triton_dispatch.prime as prime


@pytest.fixture
def fresh(monkeypatch):
    """A process that has not started the thread yet."""
    monkeypatch.setattr(prime, "_threads", [])
    monkeypatch.setattr(prime, "_pending", False)
    monkeypatch.setattr(prime, "_done", [])
    monkeypatch.setattr(prime, "_errors", [])
    monkeypatch.setattr(prime, "_spans", [])
    monkeypatch.delenv(prime.PRIME_ENV_VAR, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    # the real hook would stay installed in Triton for the rest of the test session
    monkeypatch.setattr(host_build, "install_fast_host_builds", lambda: False)
    yield
    for thread in prime._threads:
        thread.join(timeout=60)


@pytest.mark.parametrize(
    ("env", "value", "runs"),
    [
        ("TRITON_INTERPRET", "1", False),
        (prime.PRIME_ENV_VAR, "0", False),
        (prime.PRIME_ENV_VAR, "off", False),
        (prime.PRIME_ENV_VAR, "1", True),
        ("TRITON_INTERPRET", "0", True),
    ],
)
def test_it_is_off_under_the_interpreter_and_when_switched_off(
    fresh, monkeypatch, env, value, runs
):
    monkeypatch.setenv(env, value)
    monkeypatch.setattr(prime, "nvidia_gpu_present", lambda: True)
    monkeypatch.setattr(prime, "_build_driver_module", lambda: None)
    monkeypatch.setattr(prime, "_cache_key_and_ptxas", lambda: None)
    assert prime.prime_enabled() is runs
    assert prime.start() is runs
    assert bool(prime._threads) is runs


def test_without_a_gpu_no_thread_starts(fresh, monkeypatch):
    monkeypatch.setattr(prime, "nvidia_gpu_present", lambda: False)
    assert not prime.start()
    assert prime._threads == [] and not prime._pending
    prime.wait()
    assert prime.finished() == () and prime.errors() == ()


def test_with_a_gpu_it_computes_the_cache_key_asks_ptxas_and_builds_the_driver_module(
    fresh, monkeypatch
):
    """The thread computes Triton's cache key, asks ptxas for its version (the card's arch read
    from the driver's files) and builds the driver module (stand-ins here: no GPU), never
    touching CUDA; a second start is a no-op, and a first compile's wait returns only once the
    thread is done."""
    import triton.backends.nvidia.compiler as nvidia_compiler
    import triton.backends.nvidia.driver as nvidia_driver
    import triton.runtime.cache as cache

    calls = []
    release = threading.Event()

    def slow_key():
        release.wait(timeout=30)
        calls.append("key")
        return "key"

    class Utils:
        def __init__(self):
            calls.append("utils")

    def no_cuda(*args, **kwargs):
        raise AssertionError("the thread must not initialise CUDA")

    monkeypatch.setattr(prime, "nvidia_gpu_present", lambda: True)
    monkeypatch.setattr(prime, "local_card_arch", lambda: 90)
    monkeypatch.setattr(cache, "triton_key", slow_key)
    monkeypatch.setattr(nvidia_compiler, "get_ptxas_version", lambda arch: calls.append(arch))
    monkeypatch.setattr(nvidia_driver, "CudaUtils", Utils)
    monkeypatch.setattr(torch.cuda, "is_available", no_cuda)
    monkeypatch.setattr(torch.cuda, "init", no_cuda)
    assert prime.start()
    first = list(prime._threads)
    assert prime.start() and prime._threads == first  # once per process
    assert any(t.is_alive() for t in first)
    waited = []
    waiter = threading.Thread(target=lambda: (prime.wait(), waited.append(time.perf_counter())))
    waiter.start()
    time.sleep(0.05)
    assert not waited  # still computing: the compile waits
    assert calls == ["utils"]  # the driver module does not wait for the cache key
    release.set()
    waiter.join(timeout=30)
    assert waited and not any(t.is_alive() for t in first)
    assert calls == ["utils", "key", 90]
    assert prime.finished() == ("driver", "triton_key", "ptxas")
    assert prime.errors() == ()
    spans = {name: (begin, end) for name, begin, end in prime.spans()}
    assert set(spans) == {"driver", "triton_key", "ptxas"}
    assert all(0 <= begin <= end for begin, end in spans.values())
    assert spans["triton_key"][1] >= 0.05  # it ran until released, after the wait began
    assert spans["ptxas"][0] >= spans["triton_key"][1]
    assert prime.started_at() is not None


def test_an_unknown_card_skips_only_the_ptxas_question(fresh, monkeypatch):
    import triton.backends.nvidia.driver as nvidia_driver
    import triton.runtime.cache as cache

    monkeypatch.setattr(prime, "nvidia_gpu_present", lambda: True)
    monkeypatch.setattr(prime, "local_card_arch", lambda: None)
    monkeypatch.setattr(cache, "triton_key", lambda: "key")
    monkeypatch.setattr(nvidia_driver, "CudaUtils", lambda: None)
    assert prime.start()
    prime.wait()
    assert sorted(prime.finished()) == ["driver", "triton_key"]


def test_the_card_is_named_from_the_driver_files(monkeypatch, tmp_path):
    """``/proc/driver/nvidia/gpus/*/information`` names the model: a known card gives its arch,
    an unknown one or none gives ``None``."""
    gpu = tmp_path / "0000:00:01.0"
    gpu.mkdir()
    (gpu / "information").write_text("Model: \t\t NVIDIA H200\nIRQ: 1\n")
    real_glob = prime.glob.glob

    def fake_glob(pattern):
        if pattern.startswith("/proc/driver/nvidia/gpus/"):
            return real_glob(str(tmp_path / pattern.removeprefix("/proc/driver/nvidia/gpus/")))
        return []

    monkeypatch.setattr(prime.glob, "glob", fake_glob)
    assert prime.nvidia_gpu_present()
    assert prime.local_card_arch() == 90
    (gpu / "information").write_text("Model: Some Future Card\n")
    assert prime.local_card_arch() is None


def test_a_failure_on_a_thread_is_recorded_and_left_to_the_first_compile(fresh, monkeypatch):
    """A step that fails is recorded (the first compile then does it itself); the others still
    run."""
    import triton.backends.nvidia.driver as nvidia_driver
    import triton.runtime.cache as cache

    def broken():
        raise RuntimeError("internals moved")

    monkeypatch.setattr(prime, "nvidia_gpu_present", lambda: True)
    monkeypatch.setattr(prime, "local_card_arch", lambda: None)
    monkeypatch.setattr(cache, "triton_key", broken)
    monkeypatch.setattr(nvidia_driver, "CudaUtils", lambda: None)
    assert prime.start()
    prime.wait()
    assert prime.finished() == ("driver",)
    assert prime.errors() == ("triton_key: RuntimeError: internals moved",)


def test_a_traced_caller_does_not_trace_into_the_wait(fresh, monkeypatch):
    """``torch.compile(fullgraph=True)`` traces ops whose backend choice waits for the threads:
    while they still run, the wait must not put thread calls into the graph."""
    import triton.backends.nvidia.driver as nvidia_driver
    import triton.runtime.cache as cache

    release = threading.Event()
    monkeypatch.setattr(prime, "nvidia_gpu_present", lambda: True)
    monkeypatch.setattr(prime, "local_card_arch", lambda: None)
    monkeypatch.setattr(cache, "triton_key", lambda: release.wait(timeout=30))
    monkeypatch.setattr(nvidia_driver, "CudaUtils", lambda: None)
    assert prime.start()

    def op(x):
        prime.wait()
        return x + 1

    try:
        x = torch.arange(4.0)
        assert torch.equal(torch.compile(op, fullgraph=True, backend="eager")(x), x + 1)
    finally:
        release.set()
    prime.wait()
    assert not prime._pending and prime.finished() == ("driver", "triton_key")


def test_importing_triton_dispatch_starts_it():
    """A fresh process that imports the package (off the interpreter, a GPU's device file
    present) starts both threads, with Triton already imported on the importing thread."""
    code = (
        "import glob, sys, threading\n"
        "real = glob.glob\n"
        "glob.glob = lambda p, **k: ['/dev/nvidia0'] if p.startswith('/dev/nvidia') else real(p, **k)\n"
        "started = []\n"
        "threading.Thread.start = lambda self: started.append(self.name)\n"
        "import triton_dispatch\n"
        "print(sorted(started), 'triton.runtime.cache' in sys.modules)\n"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", prime.PRIME_ENV_VAR)
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "['triton-dispatch-prime-driver', 'triton-dispatch-prime-key'] True"
