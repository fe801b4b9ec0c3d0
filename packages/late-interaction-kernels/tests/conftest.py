import os

import pytest

# One config per kernel on the GPU: the suite compiles dozens of shape regimes once each, and a full
# autotune search per regime would take minutes (test_autotuned_kernels_on_gpu covers the search).
os.environ.setdefault("LATE_INTERACTION_KERNELS_AUTOTUNE", "0")

from late_interaction_kernels.ops.maxsim import buffers


@pytest.fixture(autouse=True)
def poison_kernel_outputs(monkeypatch):
    """Every buffer a kernel fills starts as NaN / int-min, so a skipped element fails the test."""
    monkeypatch.setattr(buffers, "POISON_OUTPUTS", True)
