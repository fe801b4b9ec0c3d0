import pytest

from late_interaction_kernels.ops.maxsim import buffers


@pytest.fixture(autouse=True)
def poison_kernel_outputs(monkeypatch):
    """Every buffer a kernel fills starts as NaN / int-min, so a skipped element fails the test."""
    monkeypatch.setattr(buffers, "POISON_OUTPUTS", True)
