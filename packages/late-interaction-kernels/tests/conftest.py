import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The shipped table's configs on the GPU (autotuning is opt-in): the suite compiles dozens of shape
# regimes once each, and a search per regime would take minutes (test_autotuned_kernels_on_gpu
# covers the search).
os.environ.setdefault("LATE_INTERACTION_KERNELS_AUTOTUNE", "0")

from late_interaction_kernels.ops.common import buffers


@pytest.fixture(autouse=True)
def poison_kernel_outputs(monkeypatch):
    """Every buffer a kernel fills starts as NaN / int-min, so a skipped element fails the test."""
    monkeypatch.setattr(buffers, "POISON_OUTPUTS", True)


@pytest.fixture
def compile_on_hopper():
    """Run a script that compiles kernels for an sm_90 target (no GPU needed) in a process with
    the interpreter off; ``{tests}`` in the script is this folder (for ``compile_for_hopper``).
    The interpreter accepts code the GPU compiler rejects."""
    if importlib.util.find_spec("triton.backends.nvidia") is None:
        pytest.skip("Triton's NVIDIA backend is not installed")

    def run(script: str) -> None:
        code = script.format(tests=str(Path(__file__).parent))
        env = dict(os.environ, TRITON_INTERPRET="0")
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    return run


@pytest.fixture(autouse=True)
def fresh_plans():
    """Plans capture module settings (chunk sizes, split limits) that tests patch: start each test
    without them."""
    from triton_dispatch.launch import clear_plan_caches

    clear_plan_caches()
    yield
    clear_plan_caches()


@pytest.fixture(autouse=True)
def quiet_query_norm_check(monkeypatch):
    """Tests score random, unnormalised queries with ``normalize=False``: keep ``maxsim``'s
    one-time query-norm warning out of them (``test_norm_warning.py`` turns it back on)."""
    from late_interaction_kernels.ops.maxsim.norm_check import NORM_CHECK

    monkeypatch.setattr(NORM_CHECK, "pending", False)
