"""The package's fused ops, one folder each: ``reference.py`` (the PyTorch spec), the Triton
kernels, the entry point (validation, dispatch, custom-op registration) in its own modules, and an
``__init__.py`` that names the op's public API."""
