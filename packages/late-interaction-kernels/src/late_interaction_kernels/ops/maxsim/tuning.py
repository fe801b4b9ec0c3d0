"""Autotuning settings shared by the MaxSim kernels."""

from __future__ import annotations


def tuning_bench(kernel_call, quantiles):
    """Time one autotune trial briefly: the spaces are small and their configs differ by tens of
    percent, so 25 ms per trial (Triton's default is 125 ms) separates them and keeps the first call
    of a new shape regime short."""
    import triton.testing

    return triton.testing.do_bench(kernel_call, warmup=5, rep=20, quantiles=quantiles)
