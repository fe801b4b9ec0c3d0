"""The package's fused ops, one folder each: ``reference.py`` (the PyTorch spec), the Triton
kernels, and an ``__init__.py`` entry point (validation, dispatch, custom-op registration)."""
