"""Data-parallel reconstruction across processes.

:func:`~tomo_kplanes.train.reconstruct` detects an initialised ``torch.distributed`` process group,
splits each step's batch of rays and volume-TV points evenly over the ranks and averages the
gradients with one all-reduce per step. Launch a run on several GPUs with ``torchrun``
(``python -m torch.distributed.run --nproc_per_node=N script.py``); :func:`launch_local` starts
the processes from Python instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["launch_local", "phantom_worker"]


def launch_local(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout: float = 600.0,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes inside a process group
    (``gloo`` on CPU, ``nccl`` with one GPU per rank) and return each rank's return value. ``fn``
    must be a module-level function. A rank that raises stops the others and raises
    :class:`triton_dispatch.testing.RankFailed` with its traceback; so does a run past
    ``timeout`` seconds."""
    from triton_dispatch.testing import run_ranks

    return run_ranks(fn, world_size, *args, backend=backend, timeout=timeout)


def phantom_worker(
    rank: int, world: int, config_kwargs: dict, size: int = 10, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """A small phantom reconstruction; returns the rank's final field state on the CPU (a smoke
    run for checking that replicas stay identical)."""
    from .geometry import TiltGeometry, tilt_range
    from .phantoms import shepp_logan_3d, simulate_tilt_series
    from .train import ReconstructionConfig, reconstruct

    dev = torch.device(f"cuda:{rank}") if device == "cuda" else torch.device(device)
    truth = shepp_logan_3d(size, device=dev)
    geo = TiltGeometry(tilt_range(60, 20), (size, size))
    series = simulate_tilt_series(truth, geo, n_samples=size)
    result = reconstruct(series, geo, ReconstructionConfig(**config_kwargs))
    return {k: v.detach().cpu().clone() for k, v in result.object_model.field.state_dict().items()}
