"""Autotune trial timing shared by the MaxSim kernels.

Launch configs come from the package's table (``launch_configs/``) or a heuristic; autotuning is
opt-in (``LATE_INTERACTION_KERNELS_AUTOTUNE=1`` or ``TRITON_DISPATCH_AUTOTUNE=1``, see
:mod:`triton_dispatch.tuned_kernel`), and then each trial is timed here.
"""

from __future__ import annotations


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
