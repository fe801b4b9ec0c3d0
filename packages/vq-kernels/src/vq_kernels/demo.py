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
from triton_dispatch.demo import pinned_threads, timing_conditions

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


#: steps of a run that are not timed (k-means init and warm-up), when the run has more than these
WARMUP_STEPS = 10


def train(steps: int = 100, batch: int = 256, device: str | None = None) -> dict:
    """Train for ``steps`` steps (at least 1) of ``batch`` rows and return the figures. Steps after
    the first :data:`WARMUP_STEPS` are timed; a run of no more steps than that times them all.
    On the CPU the run uses one PyTorch thread (see :func:`triton_dispatch.demo.pinned_threads`)
    and gives the caller's count back after; ``timing`` in the figures says how the time per step
    was taken."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    with pinned_threads(device) as threads:
        return _train(steps, batch, device, threads)


def _train(steps: int, batch: int, device: str, threads: int | None) -> dict:
    g = torch.Generator().manual_seed(0)
    data, source = load_data(g)
    data = data.to(device)
    torch.manual_seed(0)
    rvq = ResidualVQ(
        64, 32, 3, decay=0.95, commitment_weight=0.25, kmeans_init=True, dead_threshold=10
    ).to(device)
    restarted = 0
    # time steady-state steps only (k-means init and warm-up excluded), unless there are none
    warmup = WARMUP_STEPS if steps > WARMUP_STEPS else 0
    start = time.perf_counter()
    for step in range(steps):
        idx = torch.randint(0, data.shape[0], (batch,), generator=g).to(device)
        out = rvq(data[idx])
        restarted += int(out.restarted.sum())
        if step + 1 == warmup:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    ms_per_step = (time.perf_counter() - start) * 1e3 / (steps - warmup)
    after = f" after {warmup} warm-up steps" if warmup else ""
    timing = (
        f"mean of {steps - warmup} step{'s' if steps - warmup != 1 else ''}{after}, "
        f"{timing_conditions(device, threads)}"
    )
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
        "timing": timing,
        "timed_steps": steps - warmup,
        "device": device,
        "threads": threads,
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
            f"{stats['ms_per_step']:.2f} ms per training step ({stats['timing']})"
        ),
        backend=stats["backend"],
        key_figure=f"relative reconstruction error {stats['relative_reconstruction_error']:.3f}",
        outputs=[path],
    )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of the usage block
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


_positive_int.__name__ = "integer"


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vq-kernels", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["demo"], help="demo: train and report the figures")
    parser.add_argument(
        "--steps",
        type=_positive_int,
        default=100,
        metavar="N",
        help=f"training steps of 256 rows, at least 1; the first {WARMUP_STEPS} (k-means init "
        f"and warm-up) are not timed when there are more (default: 100)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write the figures as vq_kernels_demo.json into this directory, created if "
        "needed (default: print them only)",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        parser.error(f"argument --out: {args.out} exists and is not a directory")
    stats = train(steps=args.steps)
    for key, value in stats.items():
        print(f"{key:>30}: {value}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "vq_kernels_demo.json").write_text(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
