"""Demo: train a 3-level residual VQ on scikit-learn's handwritten digits (or, without
scikit-learn, on generated clustered data) and report reconstruction error, codebook usage and
time per step on the backend it ran.

    vq-kernels demo [--steps N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from triton_dispatch import DemoResult, select_backend

from .modules import ResidualVQ, perplexity


def load_data(generator: torch.Generator) -> tuple[torch.Tensor, str]:
    """(N, 64) fp32 rows: the 8×8 digits scaled to [0, 1], or generated clusters if scikit-learn
    is not installed."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        centers = torch.rand(40, 64, generator=generator)
        labels = torch.randint(0, 40, (1800,), generator=generator)
        noise = 0.05 * torch.randn(1800, 64, generator=generator)
        return (centers[labels] + noise).clamp(0, 1), "generated clusters (scikit-learn absent)"
    data = torch.from_numpy(load_digits().data).float() / 16.0
    return data, "scikit-learn digits"


def train(steps: int = 100, batch: int = 256, device: str | None = None) -> dict:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator().manual_seed(0)
    data, source = load_data(g)
    data = data.to(device)
    torch.manual_seed(0)
    rvq = ResidualVQ(
        64, 32, 3, decay=0.95, commitment_weight=0.25, kmeans_init=True, dead_threshold=10
    ).to(device)
    restarted = 0
    start = None
    for step in range(steps):
        idx = torch.randint(0, data.shape[0], (batch,), generator=g).to(device)
        out = rvq(data[idx])
        restarted += int(out.restarted.sum())
        if step == 9:  # time steady-state steps only (k-means init and warm-up excluded)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    ms_per_step = (time.perf_counter() - start) * 1e3 / max(steps - 10, 1)
    rvq.eval()
    with torch.no_grad():
        out = rvq(data)
    mse = float(((out.quantized - data) ** 2).mean())
    rel = mse / float(((data - data.mean(0)) ** 2).mean())
    return {
        "data": source,
        "rows": data.shape[0],
        "backend": select_backend(data),
        "steps": steps,
        "relative_reconstruction_error": rel,
        "mse": mse,
        "perplexity_per_level": [float(perplexity(out.codes[:, i], 32)) for i in range(3)],
        "codebook_size": 32,
        "dead_codes_restarted": restarted,
        "ms_per_step": ms_per_step,
        "device": device,
    }


def run_demo(output_dir: Path) -> DemoResult:
    """Entry point of the workspace ``demo`` command."""
    stats = train()
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / "vq_kernels_demo.json"
    path.write_text(json.dumps(stats, indent=2))
    ppl = "/".join(f"{p:.1f}" for p in stats["perplexity_per_level"])
    return DemoResult(
        summary=(
            f"3x32 residual VQ on {stats['data']}: perplexity {ppl} of 32, "
            f"{stats['dead_codes_restarted']} dead codes restarted, "
            f"{stats['ms_per_step']:.2f} ms/step"
        ),
        backend=stats["backend"],
        key_figure=f"relative reconstruction error {stats['relative_reconstruction_error']:.3f}",
        outputs=[path],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="vq-kernels", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["demo"])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    stats = train(steps=args.steps)
    for key, value in stats.items():
        print(f"{key:>30}: {value}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "vq_kernels_demo.json").write_text(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
