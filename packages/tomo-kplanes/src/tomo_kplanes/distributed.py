"""Data-parallel reconstruction across processes.

:func:`~tomo_kplanes.train.reconstruct` detects an initialised ``torch.distributed`` process group,
wraps the field in ``DistributedDataParallel`` (gradients all-reduced every step) and gives each
rank its own shard of the training rays. This module launches such a run on one host.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def _entry(rank: int, world: int, backend: str, init: str, fn: Callable, args: tuple) -> None:
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def launch_local(
    fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo", init_file: str
) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes inside a process group
    (``gloo`` on CPU, ``nccl`` with one GPU per rank). ``fn`` must be importable by module path."""
    import torch.multiprocessing as mp

    if os.path.exists(init_file):
        os.remove(init_file)
    mp.spawn(
        _entry, args=(world_size, backend, f"file://{init_file}", fn, args), nprocs=world_size, join=True
    )


def phantom_worker(
    rank: int, world: int, out_dir: str, config_kwargs: dict, size: int = 10, device: str = "cpu"
) -> None:
    """A small phantom reconstruction that saves each rank's final field state (a smoke run for
    checking that replicas stay identical)."""
    from .geometry import TiltGeometry, tilt_range
    from .phantoms import shepp_logan_3d, simulate_tilt_series
    from .train import ReconstructionConfig, reconstruct

    dev = torch.device(f"cuda:{rank}") if device == "cuda" else torch.device(device)
    truth = shepp_logan_3d(size, device=dev)
    geo = TiltGeometry(tilt_range(60, 20), (size, size))
    series = simulate_tilt_series(truth, geo, n_samples=size)
    result = reconstruct(series, geo, ReconstructionConfig(**config_kwargs))
    state = {k: v.detach().cpu().clone() for k, v in result.object_model.field.state_dict().items()}
    torch.save(state, os.path.join(out_dir, f"rank{rank}.pt"))
