"""Autotuning settings shared by the MaxSim kernels."""

from __future__ import annotations

import os

#: Set to ``0`` before the package is imported to run every kernel with its default config instead
#: of autotuning (the GPU test suite does: it compiles dozens of shape regimes once each, where a
#: full search per regime would take minutes; the benchmarks keep autotuning).
AUTOTUNE_ENV_VAR = "LATE_INTERACTION_KERNELS_AUTOTUNE"


def tuning_space(configs: list, default) -> list:
    """``configs``, or just ``default`` when autotuning is switched off (:data:`AUTOTUNE_ENV_VAR`)."""
    if os.environ.get(AUTOTUNE_ENV_VAR, "1").strip().lower() in ("0", "false", "no", "off"):
        return [default]
    return configs


def tuning_bench(kernel_call, quantiles):
    """Time one autotune trial briefly: the spaces are small and their configs differ by tens of
    percent, so 25 ms per trial (Triton's default is 125 ms) separates them and keeps the first call
    of a new shape regime short."""
    import triton.testing

    return triton.testing.do_bench(kernel_call, warmup=5, rep=20, quantiles=quantiles)
