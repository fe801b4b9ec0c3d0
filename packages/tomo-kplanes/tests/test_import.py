import tomo_kplanes


def test_package_imports_with_a_version() -> None:
    # "0.0.0" when imported from a source tree that is not installed (the GPU runner does that)
    assert isinstance(tomo_kplanes.__version__, str) and tomo_kplanes.__version__


def test_no_two_modules_import_each_other():
    """Imports run one way: no module imports a module that imports it back."""
    from triton_dispatch.testing.imports import mutual_imports

    assert mutual_imports("tomo_kplanes") == []
