from triton_dispatch.testing.imports import mutual_imports


def test_no_two_modules_import_each_other():
    """Imports run one way: no module imports a module that imports it back."""
    assert mutual_imports("late_interaction_kernels") == []
