"""PyLate integration tests. They need the ``pylate`` extra, which cannot share an environment
with the other integration extra, so they run in their own:

    UV_PROJECT_ENVIRONMENT=.venv-pylate uv run --locked --package late-interaction-kernels \
        --extra pylate --group dev pytest integration-tests/pylate

In the default environment (no PyLate) each test module skips itself with
``pytest.importorskip("pylate")`` at its top; a conftest cannot do that for them, since a skip
raised while a conftest is imported is reported as an error.
"""
