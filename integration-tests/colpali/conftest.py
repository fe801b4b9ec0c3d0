"""colpali-engine integration tests: they need the ``colpali`` extra, in its own environment:

    UV_PROJECT_ENVIRONMENT=.venv-colpali uv run --locked --package late-interaction-kernels \
        --extra colpali --group dev pytest integration-tests/colpali

Without colpali-engine (the default environment) every test here is skipped.
"""

import pytest

pytest.importorskip("colpali_engine", reason="needs the 'colpali' extra of late-interaction-kernels")
