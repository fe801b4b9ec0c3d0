"""``tomo-kplanes reconstruct``: reconstruct the built-in phantom (default) or a tilt series file."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from .geometry import TiltGeometry, tilt_range
from .metrics import psnr, ssim
from .objective import LossWeights
from .train import ReconstructionConfig, reconstruct, render_volume


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tomo-kplanes", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("reconstruct", help="reconstruct a volume from a tilt series")
    rec.add_argument("--tilt-series", type=Path, help="MRC (.mrc/.st) or TIFF stack")
    rec.add_argument("--angles", help="IMOD .tlt file, or comma-separated degrees")
    rec.add_argument("--phantom", choices=["shepp-logan", "nanoparticle"], default="shepp-logan")
    rec.add_argument("--size", type=int, default=32, help="phantom side / volume side")
    rec.add_argument("--max-angle", type=float, default=60.0)
    rec.add_argument("--angle-step", type=float, default=3.0)
    rec.add_argument("--dose", type=float, default=None, help="Poisson noise for the phantom")
    rec.add_argument("--steps", type=int, default=1200)
    rec.add_argument("--rotations", type=int, default=2)
    rec.add_argument("--channels", type=int, default=8)
    rec.add_argument("--rays-per-batch", type=int, default=512)
    rec.add_argument("--volume-tv", type=float, default=1e-4, help="volume TV weight")
    rec.add_argument("--sirt-iterations", type=int, default=30)
    rec.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    rec.add_argument("--backend", default=None, help="auto (default), triton, interpret or torch")
    rec.add_argument("--tv-points", type=int, default=1024, help="volume-TV points per step")
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--output", type=Path, default=Path("tomo-kplanes-output"))
    rec.add_argument(
        "--overwrite", action="store_true", help="replace the outputs of an earlier run in --output"
    )
    rec.add_argument(
        "--permissive-mrc",
        action="store_true",
        help="read an MRC tilt series whose header is invalid (a warning, not an error)",
    )
    rec.add_argument("--no-progress", action="store_true")
    rec.add_argument(
        "--warmup",
        action="store_true",
        help="before the reconstruction, compile every kernel of a training step at this run's "
        "shape (tomo_kplanes.warmup) and print its one-line report to stderr; the reconstruction's "
        "own time then leaves compilation out",
    )
    rec.add_argument(
        "--cuda-graph",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replay each training step as one CUDA graph (default: on CUDA)",
    )
    return parser


def _angles_arg(text: str):
    path = Path(text)
    if path.exists():
        return path
    return [float(a) for a in text.split(",") if a.strip()]


#: every file a run writes into ``--output``
OUTPUT_FILES = ("volume.mrc", "sirt.mrc", "volume.pt", "slices.png", "metrics.json")


def _check_output(out: Path, overwrite: bool) -> None:
    existing = [name for name in OUTPUT_FILES if (out / name).exists()]
    if existing and not overwrite:
        raise FileExistsError(
            f"{out} already holds {', '.join(existing)} from an earlier run; "
            "pass --overwrite to replace them or choose another --output"
        )


def _warmup(config: ReconstructionConfig, geo: TiltGeometry, device: torch.device):
    """:func:`tomo_kplanes.warmup` of the step ``reconstruct`` will run with ``config``."""
    from .warmup import warmup

    # reconstruct's batch: rays_per_batch, or every training ray when there are fewer
    # (the held-out fraction of the rays takes no part in training)
    held = round(geo.num_rays * config.holdout_fraction) if config.holdout_fraction > 0 else 0
    rays = min(config.rays_per_batch, max(1, geo.num_rays - held))
    plain = config.rotations == 0
    shape = f"{config.resolution}x{config.channels}x{1 if plain else config.rotations}"
    return warmup(
        [shape + (":plain" if plain else "")],
        device=device,
        rays=rays,
        samples=config.samples_per_ray,
        tv_points=config.tv_points if config.weights.volume_tv > 0 else 0,
        backend=config.backend,
    )


def run_reconstruct(args: argparse.Namespace) -> dict:
    from .io import load_tilt_series, write_slices_png, write_volume_mrc
    from .phantoms import nanoparticle_phantom, shepp_logan_3d, simulate_tilt_series
    from .sirt import sirt

    _check_output(args.output, args.overwrite)  # before hours of training, not after
    device = torch.device(args.device)
    truth = None
    if args.tilt_series is not None:
        if args.angles is None:
            raise SystemExit("--tilt-series needs --angles")
        data, angles = load_tilt_series(
            args.tilt_series, _angles_arg(args.angles), permissive=args.permissive_mrc
        )
        series = torch.from_numpy(data).to(device)
        scale = float(series.abs().amax().clamp_min(1e-12))
        series = series / scale  # line integrals of order 1 suit the field's initialisation
        geo = TiltGeometry(torch.from_numpy(angles), tuple(series.shape[1:]))
        size = max(series.shape[1:])
    else:
        size = args.size
        maker = shepp_logan_3d if args.phantom == "shepp-logan" else nanoparticle_phantom
        truth = maker(size, device=device) if maker is shepp_logan_3d else maker(size, seed=args.seed, device=device)
        geo = TiltGeometry(tilt_range(args.max_angle, args.angle_step), (size, size))
        series = simulate_tilt_series(truth, geo, dose=args.dose, seed=args.seed)
    shape = (geo.detector_shape[0], geo.detector_shape[0], geo.detector_shape[1])
    config = ReconstructionConfig(
        resolution=size, channels=args.channels, rotations=args.rotations, steps=args.steps,
        rays_per_batch=args.rays_per_batch, samples_per_ray=size, tv_points=args.tv_points, backend=args.backend,
        weights=LossWeights(volume_tv=args.volume_tv, plane_tv=1e-4), seed=args.seed,
        progress=not args.no_progress, eval_every=max(50, args.steps // 8),
        cuda_graph=args.cuda_graph,
    )
    if args.warmup:
        report = _warmup(config, geo, device)
        print(report, file=sys.stderr)
    t0 = time.perf_counter()
    result = reconstruct(series, geo, config)
    ours = render_volume(result.object_model, shape)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    baseline = sirt(series, geo, shape, iterations=args.sirt_iterations, n_samples=size)
    t_sirt = time.perf_counter() - t0
    out = args.output
    out.mkdir(parents=True, exist_ok=True)
    metrics: dict = {"steps_run": result.steps_run, "stopped_early": result.stopped_early,
                     "seconds_ours": t_ours, "seconds_sirt": t_sirt, "final_loss": result.losses[-1] if result.losses else None}
    if args.warmup:
        metrics["seconds_warmup"] = report.seconds
    files = {}
    try:
        files["volume"] = str(write_volume_mrc(out / "volume.mrc", ours))
        files["sirt_volume"] = str(write_volume_mrc(out / "sirt.mrc", baseline))
    except ImportError:
        torch.save(ours.cpu(), out / "volume.pt")
        files["volume"] = str(out / "volume.pt")
    panels = {"truth": truth, "SIRT": baseline, "ours": ours} if truth is not None else {"SIRT": baseline, "ours": ours}
    files["slices"] = str(write_slices_png(out / "slices.png", panels))
    if truth is not None:
        for name, vol in (("ours", ours), ("sirt", baseline)):
            metrics[f"psnr_{name}"] = psnr(truth, vol)
            metrics[f"ssim_{name}"] = ssim(truth, vol)
    metrics["files"] = files
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return metrics


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "reconstruct":
        try:
            metrics = run_reconstruct(args)
        except FileExistsError as exc:
            print(f"tomo-kplanes: {exc}", file=sys.stderr)
            return 2
        summary = {k: v for k, v in metrics.items() if k != "files"}
        print(json.dumps(summary, indent=2))
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
