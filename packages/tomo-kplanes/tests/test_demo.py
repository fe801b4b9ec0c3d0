"""The ``uv run demo`` entry: its reconstruction runs on one PyTorch thread, gives the caller's
count back, and its printed time says how it was taken."""

import torch

from tomo_kplanes import cli
from tomo_kplanes.demo import run_demo


def test_demo_reconstructs_on_one_thread_and_says_so(tmp_path, three_threads, monkeypatch):
    real_run, real_reconstruct = cli.run_reconstruct, cli.reconstruct
    seen = []

    def small(args):  # the demo's run, shrunk to a few steps
        args.size, args.steps, args.angle_step, args.sirt_iterations = 12, 4, 30.0, 2
        args.rays_per_batch, args.channels, args.tv_points, args.backend = 64, 2, 64, "torch"
        return real_run(args)

    def timed(*args, **kwargs):  # the part whose time the demo prints
        seen.append(torch.get_num_threads())
        return real_reconstruct(*args, **kwargs)

    monkeypatch.setattr(cli, "run_reconstruct", small)
    monkeypatch.setattr(cli, "reconstruct", timed)
    result = run_demo(tmp_path)
    assert seen == [1]
    assert torch.get_num_threads() == 3
    assert "reconstructed in " in result.key_figure
    assert " s (4 steps and the volume's render, wall time of one run, 1 thread, CPU)" in (
        result.key_figure
    )
