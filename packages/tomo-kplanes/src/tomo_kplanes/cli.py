"""tomo-kplanes reconstruct: reconstruct the built-in phantom (default) or a tilt series file."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from triton_dispatch import select_backend
from triton_dispatch.demo import pinned_threads

from .cli_pose import POSE_FILE, add_pose_flags, misaligned, pose_config, write_pose
from .geometry import TiltGeometry, tilt_range
from .metrics import psnr, ssim
from .objective import LossWeights
from .train import ReconstructionConfig, reconstruct, render_volume


class UsageError(Exception):
    """A bad command-line value or input file: :func:`main` prints it as one line (naming the flag)
    and exits with status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of the usage block
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: ...)" to every option whose help does not already say its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default:" in text.lower() or any(
            action.default is nothing for nothing in (None, False, argparse.SUPPRESS)
        ):
            return text
        return super()._get_help_string(action)


def _integer(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def _number(low: float, high: float = math.inf, *, low_open: bool = False):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < low or value > high or (low_open and value == low):
            bound = f"greater than {low:g}" if low_open else f"at least {low:g}"
            if high < math.inf:
                bound += f" and at most {high:g}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def _angles_arg(text: str) -> Path | list[float]:
    """``--angles``: an existing file, or comma-separated degrees (``-60,0,60``)."""
    path = Path(text)
    if path.is_file():
        return path
    items = [a.strip() for a in text.split(",") if a.strip()]
    values = []
    for item in items:
        try:
            value = float(item)
        except ValueError:
            if "," not in text:  # one word that is not a number: meant as a file name
                raise argparse.ArgumentTypeError(
                    f"angle file {text} does not exist (expected an IMOD .tlt file or "
                    "comma-separated degrees such as -60,0,60)"
                ) from None
            raise argparse.ArgumentTypeError(
                f"{item!r} is not a number (in {text!r}); expected comma-separated degrees such "
                "as -60,0,60, or an IMOD .tlt file"
            ) from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(
                f"{item!r} is not a finite angle (in {text!r}); expected comma-separated degrees "
                "such as -60,0,60, or an IMOD .tlt file"
            )
        values.append(value)
    if not values:
        raise argparse.ArgumentTypeError(
            f"expected an IMOD .tlt file or comma-separated degrees, got {text!r}"
        )
    return values


_NUMBER_LIST = re.compile(r"^-[\d.]")


def _join_negative_lists(argv: list[str]) -> list[str]:
    """``--angles -60,0,60`` as ``--angles=-60,0,60``: argparse takes a value that starts with a
    minus and is not a plain number for an option (and reports a missing argument)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--":
            out.extend(argv[i:])
            break
        if argv[i] == "--angles" and i + 1 < len(argv) and _NUMBER_LIST.match(argv[i + 1]):
            out.append(f"--angles={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


THREADS_HELP = (
    "PyTorch threads of a CPU run (ignored on CUDA). Default: 1, unless OMP_NUM_THREADS is set "
    "(then PyTorch's own choice, which follows it). At the default sizes more threads gain "
    "little (the defaults took 35 s with 1 thread and 36 s with 2 on a lightly loaded 2-core "
    "machine), while threads that wait for a busy core cost a great deal (on a 2-core machine "
    "shared with other work: 7 min 35 s with PyTorch's default of 2 threads, 42 s with 1; same "
    "result). "
    "Give more for large volumes on a machine of your own."
)


#: the Python API's defaults, which the flags take theirs from (one place for both)
_DEFAULTS = ReconstructionConfig()
#: side of the built-in phantom when --size is not given
PHANTOM_SIZE = 32


def _setting(parser: argparse.ArgumentParser, flag: str, low: int, metavar: str, help: str) -> None:
    """An integer flag of the ``ReconstructionConfig`` field of the same name, with its default."""
    default = getattr(_DEFAULTS, flag.removeprefix("--").replace("-", "_"))
    parser.add_argument(flag, type=_integer(low), metavar=metavar, default=default, help=help)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tomo-kplanes", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser(
        "reconstruct",
        help="reconstruct a volume from a tilt series",
        description="Reconstruct the built-in phantom (default) or a tilt series file with a "
        "rotated K-Planes field and with SIRT, and write both volumes, a slice picture and "
        "metrics to --output. On a 2-core CPU the defaults take about 35 s.",
        formatter_class=_HelpFormatter,
    )
    rec.add_argument(
        "--tilt-series",
        type=Path,
        metavar="FILE",
        help="MRC (.mrc/.st/.ali) or TIFF stack to reconstruct (default: the built-in --phantom)",
    )
    rec.add_argument(
        "--angles",
        type=_angles_arg,
        metavar="FILE|LIST",
        help="tilt angles of --tilt-series: an IMOD .tlt file, or comma-separated degrees "
        "(-60,0,60 or --angles=-60,0,60)",
    )
    rec.add_argument(
        "--phantom",
        choices=["shepp-logan", "nanoparticle"],
        default="shepp-logan",
        help="the built-in test object",
    )
    rec.add_argument(
        "--size",
        type=_integer(2),
        metavar="N",
        default=None,
        help=f"side of the built-in phantom in voxels (default: {PHANTOM_SIZE}); a --tilt-series "
        "sets its own volume side, its detector's larger side",
    )
    rec.add_argument(
        "--max-angle",
        type=_number(0, 90, low_open=True),
        metavar="DEG",
        default=60.0,
        help="phantom tilt range: ±this many degrees",
    )
    rec.add_argument(
        "--angle-step",
        type=_number(0, low_open=True),
        metavar="DEG",
        default=3.0,
        help="phantom tilt step in degrees",
    )
    rec.add_argument(
        "--dose",
        type=_number(0, low_open=True),
        metavar="COUNTS",
        default=None,
        help="Poisson noise for the phantom, in counts per pixel (default: noiseless)",
    )
    _setting(rec, "--steps", 1, "N", "training steps")
    _setting(rec, "--rotations", 0, "T", "learned plane rotations (0: plain K-Planes)")
    _setting(rec, "--channels", 1, "C", "feature channels per plane")
    _setting(
        rec,
        "--resolution",
        2,
        "N",
        "plane side in pixels (default: the volume side, the detector's larger side)",
    )
    _setting(rec, "--rays-per-batch", 1, "N", "rays per training step")
    _setting(
        rec,
        "--samples-per-ray",
        1,
        "N",
        "samples along each ray (default: the volume side, the detector's larger side)",
    )
    rec.add_argument(
        "--volume-tv",
        type=_number(0),
        metavar="W",
        default=_DEFAULTS.weights.volume_tv,
        help="volume TV weight",
    )
    rec.add_argument(
        "--sirt-iterations",
        type=_integer(1),
        metavar="N",
        default=30,
        help="iterations of the SIRT baseline",
    )
    rec.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="torch device (default: cuda when available, else cpu)",
    )
    rec.add_argument(
        "--backend",
        default=None,
        help="kernel backend: triton, interpret or torch (default: chosen for the device)",
    )
    rec.add_argument("--threads", type=_integer(1), default=None, metavar="N", help=THREADS_HELP)
    _setting(rec, "--tv-points", 0, "N", "volume-TV points per step")
    _setting(rec, "--seed", 0, "N", "seed of the field, the rays and the phantom's noise")
    rec.add_argument(
        "--output",
        type=Path,
        metavar="DIR",
        default=Path("tomo-kplanes-output"),
        help="folder for the outputs",
    )
    rec.add_argument(
        "--overwrite", action="store_true", help="replace the outputs of an earlier run in --output"
    )
    rec.add_argument(
        "--checkpoint-every",
        type=_integer(0),
        default=0,
        metavar="N",
        help="save the training state every N steps to OUTPUT/checkpoint.pt (to the --resume "
        "file when resuming), atomically; 0: no checkpoints",
    )
    rec.add_argument(
        "--resume",
        type=Path,
        metavar="PATH",
        help="continue the interrupted run whose checkpoint is PATH from its saved step; give "
        "the same flags as that run: the result equals that of an uninterrupted run",
    )
    rec.add_argument(
        "--permissive-mrc",
        action="store_true",
        help="read an MRC tilt series whose header is invalid (a warning, not an error)",
    )
    rec.add_argument("--no-progress", action="store_true", help="no progress bar")
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
    add_pose_flags(rec, _number, _integer)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's arguments (``sys.argv[1:]`` by default); a bad value exits with status 2
    and a one-line message naming the flag."""
    return _parser().parse_args(_join_negative_lists(sys.argv[1:] if argv is None else list(argv)))


#: the checkpoint ``--checkpoint-every`` writes into ``--output`` (without ``--resume``)
CHECKPOINT_FILE = "checkpoint.pt"
#: every file a run writes into ``--output``
OUTPUT_FILES = (
    "volume.mrc",
    "sirt.mrc",
    "volume.pt",
    "slices.png",
    "metrics.json",
    POSE_FILE,
    CHECKPOINT_FILE,
)
_PHANTOM_NAMES = {"shepp-logan": "Shepp-Logan", "nanoparticle": "nanoparticle"}
#: settings a resumed run may change: they do not alter the steps it runs
_RESUMABLE_CHANGES = {"progress", "checkpoint_every", "checkpoint_path", "backend", "cuda_graph"}


def _check_output(out: Path, overwrite: bool, resume: Path | None = None) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output: {out} is a file, not a folder")
    own = resume.resolve() if resume is not None else None
    existing = [
        name for name in OUTPUT_FILES if (out / name).exists() and (out / name).resolve() != own
    ]
    if existing and not overwrite:
        hint = (
            f" (or --resume {out / CHECKPOINT_FILE} to continue that run)"
            if CHECKPOINT_FILE in existing and resume is None
            else ""
        )
        raise FileExistsError(
            f"{out} already holds {', '.join(existing)} from an earlier run; "
            f"pass --overwrite to replace them or choose another --output{hint}"
        )


def checkpoint_path(args: argparse.Namespace) -> Path | None:
    """Where the run saves its checkpoints: the ``--resume`` file, else ``OUTPUT/checkpoint.pt``
    with ``--checkpoint-every``, else nowhere."""
    if args.resume is not None:
        return args.resume
    return args.output / CHECKPOINT_FILE if args.checkpoint_every else None


def _check_resume(path: Path, config: ReconstructionConfig) -> int:
    """The step the checkpoint at ``path`` continues from, after checking it was written by a run
    with the same settings."""
    from .checkpoint import load_checkpoint

    if not path.is_file():
        raise UsageError(f"--resume: checkpoint {path} does not exist")
    try:
        state = load_checkpoint(path, map_location="cpu")
    except ValueError as exc:
        raise UsageError(f"--resume: {exc}") from None
    saved, now = state.get("config"), asdict(config)
    if not isinstance(saved, dict) or "step" not in state:
        raise UsageError(f"--resume: {path} is not a reconstruction checkpoint")
    changed = [
        f"{key} {saved.get(key)!r} in the checkpoint, {now[key]!r} now"
        for key in now
        if key not in _RESUMABLE_CHANGES and saved.get(key) != now[key]
    ]
    if changed:
        raise UsageError(
            f"--resume: {path} was written by a run with other settings ({'; '.join(changed)}); "
            "give the flags of that run"
        )
    return int(state["step"])


def cpu_threads(device: torch.device, threads: int | None):
    """Run a CPU reconstruction on ``threads`` PyTorch threads (``None``: 1, unless
    ``OMP_NUM_THREADS`` is set, then PyTorch's own choice); restores the previous count after.
    Yields the count in use, or ``None`` on other devices (left alone)."""
    return pinned_threads(device, threads)


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


def _device(args: argparse.Namespace) -> torch.device:
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        raise UsageError(f"--device: {str(exc).splitlines()[0]}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {args.device}: no CUDA device is available; use --device cpu")
    try:
        select_backend(device=device, backend=args.backend)
    except ValueError as exc:  # BackendUnavailableError included
        raise UsageError(f"--backend: {exc}") from None
    return device


def _load_series(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    from .io import CorruptMRCHeaderError, read_angles, read_tilt_series

    # The file before the missing flag: reporting --angles first would send the user to find the
    # angles of a file that then turns out not to exist or not to be readable.
    try:
        data = read_tilt_series(args.tilt_series, permissive=args.permissive_mrc)
    except CorruptMRCHeaderError as exc:
        raise UsageError(f"--tilt-series: {exc.with_hint('pass --permissive-mrc')}") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--tilt-series: {exc}") from None
    if args.angles is None:
        raise UsageError(
            "--tilt-series needs --angles (an IMOD .tlt file or comma-separated degrees)"
        )
    try:
        angles = read_angles(args.angles)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--angles: {exc}") from None
    if data.shape[0] != angles.shape[0]:
        raise UsageError(
            f"--angles: {angles.shape[0]} tilt angles were given for the {data.shape[0]} images "
            f"of {args.tilt_series}"
        )
    return data, angles


def _check_flags(args: argparse.Namespace) -> None:
    """Flags that contradict each other: reported before anything else, so that fixing one error
    does not uncover another that was there from the start."""
    if args.tilt_series is None and args.angles is not None:
        raise UsageError(
            "--angles needs --tilt-series (the phantom's tilts are --max-angle and --angle-step)"
        )
    if args.tilt_series is not None and (args.misalign_shifts or args.misalign_tilt_axis):
        raise UsageError(
            "--misalign-shifts and --misalign-tilt-axis misalign the built-in phantom's series; "
            "a --tilt-series is recorded as it is"
        )
    if args.tilt_series is not None and args.size is not None:
        raise UsageError(
            "--size is the built-in phantom's side; a --tilt-series sets its own volume side "
            "(its detector's larger side): leave --size out, or set the planes' side with "
            "--resolution"
        )


def reconstruction_config(args: argparse.Namespace, geometry: TiltGeometry) -> ReconstructionConfig:
    """The settings ``tomo-kplanes reconstruct`` runs ``args`` with on ``geometry``: the flags
    over :class:`ReconstructionConfig`'s defaults (whose automatic settings are filled in for
    ``geometry`` by :meth:`ReconstructionConfig.resolved`), plus the run's own output settings."""
    ckpt = checkpoint_path(args)
    return ReconstructionConfig(
        resolution=args.resolution,
        channels=args.channels,
        rotations=args.rotations,
        steps=args.steps,
        rays_per_batch=args.rays_per_batch,
        samples_per_ray=args.samples_per_ray,
        tv_points=args.tv_points,
        backend=args.backend,
        weights=LossWeights(volume_tv=args.volume_tv, plane_tv=_DEFAULTS.weights.plane_tv),
        seed=args.seed,
        progress=not args.no_progress,
        cuda_graph=args.cuda_graph,
        checkpoint_every=args.checkpoint_every,
        checkpoint_path=None if ckpt is None else str(ckpt),
        **pose_config(args),
    ).resolved(geometry)


def run_reconstruct(args: argparse.Namespace) -> dict:
    """Run ``tomo-kplanes reconstruct`` with parsed ``args``; returns the metrics it writes.

    Raises:
        UsageError: a bad flag value or input file (before any training).
        FileExistsError: ``--output`` holds an earlier run's outputs and ``--overwrite`` is off.
    """
    _check_flags(args)
    device = _device(args)
    _check_output(args.output, args.overwrite, args.resume)  # before hours of training, not after
    with cpu_threads(device, args.threads) as threads:
        return _run(args, device, threads)


def _run(args: argparse.Namespace, device: torch.device, threads: int | None) -> dict:
    from .io import write_slices_png, write_volume_mrc
    from .phantoms import nanoparticle_phantom, shepp_logan_3d, simulate_tilt_series
    from .sirt import sirt

    truth = recorded = None
    if args.tilt_series is not None:
        data, angles = _load_series(args)
        series = torch.from_numpy(data).to(device)
        geo = TiltGeometry(torch.from_numpy(angles), tuple(series.shape[1:]))
        size = max(series.shape[1:])
        title = (
            f"Central slices: {args.tilt_series.name}, {len(angles)} tilts from "
            f"{angles.min():g}° to {angles.max():g}°"
        )
    else:
        size = PHANTOM_SIZE if args.size is None else args.size
        maker = shepp_logan_3d if args.phantom == "shepp-logan" else nanoparticle_phantom
        truth = (
            maker(size, device=device)
            if maker is shepp_logan_3d
            else maker(size, seed=args.seed, device=device)
        )
        geo = TiltGeometry(tilt_range(args.max_angle, args.angle_step), (size, size))
        recorded = misaligned(args, geo)
        series = simulate_tilt_series(truth, recorded, dose=args.dose, seed=args.seed)
        noise = "noiseless" if args.dose is None else f"dose {args.dose:g}"
        title = (
            f"Central slices: {_PHANTOM_NAMES[args.phantom]} phantom ({size} x {size} x {size}), "
            f"{geo.num_tilts} tilts of ±{args.max_angle:g}° in {args.angle_step:g}° steps, {noise}"
        )
    # line integrals of order 1 suit the field's initialisation: a sparse phantom's (a few
    # particles in an empty box, peak ~0.4) trained as they are collapse to an empty volume
    scale = float(series.abs().amax().clamp_min(1e-12))
    series = series / scale
    # a phantom's volumes go back to its units, to be scored against it; a file's stay normalised
    units = scale if truth is not None else 1.0
    shape = (geo.detector_shape[0], geo.detector_shape[0], geo.detector_shape[1])
    ckpt = checkpoint_path(args)
    config = reconstruction_config(args, geo)
    resumed_from = _check_resume(args.resume, config) if args.resume is not None else None
    if args.warmup:
        report = _warmup(config, geo, device)
        print(report, file=sys.stderr)
    t0 = time.perf_counter()
    result = reconstruct(series, geo, config, resume=resumed_from is not None)
    ours = render_volume(result.object_model, shape) * units
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    baseline = sirt(series, geo, shape, iterations=args.sirt_iterations, n_samples=size) * units
    t_sirt = time.perf_counter() - t0
    out = args.output
    out.mkdir(parents=True, exist_ok=True)
    metrics: dict = {
        "steps_run": result.steps_run,
        "stopped_early": result.stopped_early,
        "seconds_ours": t_ours,
        "seconds_sirt": t_sirt,
        "final_loss": result.losses[-1] if result.losses else None,
        "explained": result.explained,
        "collapsed": result.collapsed,
        "device": str(device),
        "threads": threads,
    }
    if resumed_from is not None:
        metrics["resumed_from_step"] = resumed_from
    if args.warmup:
        metrics["seconds_warmup"] = report.seconds
    if result.pose is not None:
        metrics.update(write_pose(out, result, series, recorded))
    files = {}
    try:
        files["volume"] = str(write_volume_mrc(out / "volume.mrc", ours))
        files["sirt_volume"] = str(write_volume_mrc(out / "sirt.mrc", baseline))
    except ImportError:
        torch.save(ours.cpu(), out / "volume.pt")
        files["volume"] = str(out / "volume.pt")
    if ckpt is not None and ckpt.exists():
        files["checkpoint"] = str(ckpt)
    sirt_name, ours_name = f"SIRT ({args.sirt_iterations} iterations)", "K-Planes (ours)"
    notes = {}
    if truth is not None:
        for key, name, vol in (("ours", ours_name, ours), ("sirt", sirt_name, baseline)):
            if key == "ours" and result.collapsed:  # an empty volume's score is not a result
                metrics["psnr_ours"] = metrics["ssim_ours"] = None
                notes[name] = "collapsed"
                continue
            metrics[f"psnr_{key}"] = psnr(truth, vol)
            notes[name] = f"PSNR {metrics[f'psnr_{key}']:.1f} dB"
            # SSIM's 11-voxel Gaussian window needs every side >= 11 (null for smaller phantoms)
            metrics[f"ssim_{key}"] = ssim(truth, vol) if min(truth.shape) >= 11 else None
            if metrics[f"ssim_{key}"] is not None:
                notes[name] += f", SSIM {metrics[f'ssim_{key}']:.2f}"
        panels = {"ground truth": truth, sirt_name: baseline, ours_name: ours}
        value_range = (float(truth.min()), float(truth.max()))
    else:
        panels, value_range = {sirt_name: baseline, ours_name: ours}, None
    files["slices"] = str(
        write_slices_png(
            out / "slices.png", panels, title=title, notes=notes, value_range=value_range
        )
    )
    metrics["files"] = files
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return metrics


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "reconstruct":
        try:
            metrics = run_reconstruct(args)
        except (UsageError, FileExistsError) as exc:
            print(f"tomo-kplanes reconstruct: error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            ckpt = checkpoint_path(args)
            hint = (
                f"; continue it with --resume {ckpt} and the same flags"
                if ckpt is not None and ckpt.exists()
                else ""
            )
            print(f"tomo-kplanes reconstruct: interrupted{hint}", file=sys.stderr)
            return 130
        summary = {k: v for k, v in metrics.items() if k != "files"}
        print(json.dumps(summary, indent=2))
        print(f"wrote {args.output}")
        if metrics["collapsed"]:
            print(
                "tomo-kplanes reconstruct: error: the reconstruction collapsed to an empty "
                "volume, which is not a result; try another --seed or a smaller --volume-tv",
                file=sys.stderr,
            )
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
