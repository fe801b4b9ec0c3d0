"""The ``uv run demo`` entry: a small Shepp–Logan reconstruction against SIRT on CPU (~10 s)."""

from __future__ import annotations

from pathlib import Path

from triton_dispatch import DemoResult, select_backend
from triton_dispatch.demo import timing_conditions


def run_demo(output_dir: Path) -> DemoResult:
    import torch

    from .cli import parse_args, run_reconstruct

    # ``uv run demo`` owns ``output_dir`` (demo-output/tomo-kplanes): a new run replaces the files
    # of the previous one instead of refusing them as a user's earlier results
    args = parse_args(
        ["reconstruct", "--size", "24", "--steps", "600", "--angle-step", "5",
         "--sirt-iterations", "20", "--rays-per-batch", "256", "--no-progress",
         "--device", "cpu", "--output", str(output_dir), "--overwrite"]
    )  # fmt: skip
    # run_reconstruct pins the CPU run to one PyTorch thread (--threads), as the other demos do
    # through triton_dispatch.demo.pinned_threads, and gives the caller's count back after
    metrics = run_reconstruct(args)
    conditions = timing_conditions(metrics["device"], metrics["threads"])
    return DemoResult(
        summary="24³ Shepp–Logan, ±60° tilt series, rotated K-Planes vs SIRT",
        backend=select_backend(device=torch.device("cpu")),
        key_figure=(
            f"PSNR {metrics['psnr_ours']:.1f} dB (SIRT {metrics['psnr_sirt']:.1f} dB), "
            f"reconstructed in {metrics['seconds_ours']:.1f} s ({metrics['steps_run']} steps and "
            f"the volume's render, wall time of one run, {conditions})"
        ),
        outputs=[Path(p) for p in metrics["files"].values()],
    )
