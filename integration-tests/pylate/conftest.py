"""PyLate integration tests. They need the ``pylate`` extra, which cannot share an environment
with the other integration extra, so they run in their own:

    UV_PROJECT_ENVIRONMENT=.venv-pylate uv run --locked --package late-interaction-kernels \
        --extra pylate --group dev pytest integration-tests/pylate

In the default environment (no PyLate) each test module skips itself with
``pytest.importorskip("pylate")`` at its top; a conftest cannot do that for them, since a skip
raised while a conftest is imported is reported as an error.
"""

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
