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
    """Time one autotune trial on a CUDA graph of repeated launches, briefly.

    At small shapes (a rerank of 1000 short documents, an in-batch step of 32) one launch costs
    more host time than the kernel takes on the GPU, so timing plain launches measures the host
    and picks a config at random (seen on an H100: a 3× slower forward); a captured graph times
    the kernels alone. 20 ms per trial (Triton's default is 125 ms) separates configs that differ
    by tens of percent and keeps the first call of a new shape regime short.
    """
    import triton.testing

    return triton.testing.do_bench_cudagraph(kernel_call, rep=20, quantiles=quantiles)
