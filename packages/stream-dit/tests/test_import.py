import stream_dit
from triton_dispatch.testing.imports import mutual_imports


def test_package_imports_with_a_version() -> None:
    # "0.0.0" when imported from a source tree that is not installed (the GPU runner does that)
    assert isinstance(stream_dit.__version__, str) and stream_dit.__version__


def test_no_two_modules_import_each_other():
    """Imports run one way: no module imports a module that imports it back."""
    assert mutual_imports("stream_dit") == []
