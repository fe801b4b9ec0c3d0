import late_interaction_kernels


def test_package_imports_with_a_version() -> None:
    # "0.0.0" when imported from a source tree that is not installed (the GPU runner does that)
    assert (
        isinstance(late_interaction_kernels.__version__, str)
        and late_interaction_kernels.__version__
    )
