"""colpali-engine integration tests. They need the ``colpali`` extra, which cannot share an environment
with the other integration extra, so they run in their own:

    UV_PROJECT_ENVIRONMENT=.venv-colpali uv run --locked --package late-interaction-kernels \
        --extra colpali --group dev pytest integration-tests/colpali

In the default environment (no colpali-engine) each test module skips itself with
``pytest.importorskip("colpali_engine")`` at its top; a conftest cannot do that for them, since a skip
raised while a conftest is imported is reported as an error.
"""
