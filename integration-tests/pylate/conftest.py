"""PyLate integration tests: they need the ``pylate`` extra, in its own environment:

    UV_PROJECT_ENVIRONMENT=.venv-pylate uv run --locked --package late-interaction-kernels \
        --extra pylate --group dev pytest integration-tests/pylate

Without PyLate (the default environment) every test here is skipped.
"""

import pytest

pytest.importorskip("pylate", reason="needs the 'pylate' extra of late-interaction-kernels")
