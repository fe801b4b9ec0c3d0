import tomo_kplanes


def test_package_imports_with_a_version() -> None:
    # "0.0.0" when imported from a source tree that is not installed (the GPU runner does that)
    assert isinstance(tomo_kplanes.__version__, str) and tomo_kplanes.__version__
