"""A training run to be killed: ``python kplanes_resume_child.py CKPT THREADS``.

Each checkpoint is followed by a pause, so that a kill sent after a checkpoint appears lands between
two checkpoints (a kill during a write is covered by the atomic write itself).
"""

from __future__ import annotations

import sys
import time

import torch

from tomo_kplanes import train
from tomo_kplanes.geometry import TiltGeometry, tilt_range
from tomo_kplanes.phantoms import shepp_logan_3d, simulate_tilt_series
from tomo_kplanes.train import ReconstructionConfig

STEPS, EVERY = 40, 4


def data(size: int = 10):
    geo = TiltGeometry(tilt_range(60, 20), (size, size))
    return geo, simulate_tilt_series(shepp_logan_3d(size), geo, n_samples=size)


def config(ckpt: str | None) -> ReconstructionConfig:
    return ReconstructionConfig(
        resolution=10, channels=3, rotations=2, steps=STEPS, rays_per_batch=64, samples_per_ray=10,
        tv_points=64, backend="torch", progress=False, eval_every=4, holdout_fraction=0.05,
        patience=100, checkpoint_every=EVERY if ckpt else 0, checkpoint_path=ckpt,
    )


def main() -> None:
    ckpt, threads = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(threads)
    save = train.save_checkpoint

    def save_then_pause(state, path):
        save(state, path)
        time.sleep(0.3)

    train.save_checkpoint = save_then_pause
    geo, series = data()
    train.reconstruct(series, geo, config(ckpt))


if __name__ == "__main__":
    main()
