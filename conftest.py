# Sets TRITON_INTERPRET=1 on machines without CUDA before any kernel module imports Triton, and
# provides the gpu/slow markers and the seed/rng fixtures. See triton_dispatch.pytest_plugin.
pytest_plugins = ["triton_dispatch.pytest_plugin"]
