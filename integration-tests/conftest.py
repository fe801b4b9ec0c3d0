"""Fixtures shared by the third-party integration suites."""

import pytest

import late_interaction_kernels


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts the calls that reach the fused kernels, so a test knows the fast path ran."""
    calls = {"n": 0}
    for name in ("maxsim", "maxsim_pairs"):
        original = getattr(late_interaction_kernels, name)

        def counted(*args, _original=original, **kwargs):
            calls["n"] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(late_interaction_kernels, name, counted)
    return calls
