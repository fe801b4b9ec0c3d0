"""``tomo-kplanes reconstruct``'s alignment flags and outputs: learning the tilt series' pose
(``--learn-shift``, ``--learn-tilt-axis``), misaligning the built-in phantom's series to try it
(``--misalign-shifts``, ``--misalign-tilt-axis``), and ``pose.json`` (the learned shifts and tilt
axis per tilt, with each aligned tilt's residual)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from .geometry import TiltGeometry
from .pose import shift_error_px, tilt_residuals
from .train import ReconstructionConfig, ReconstructionResult

#: the file the pose goes to in ``--output``
POSE_FILE = "pose.json"


def add_pose_flags(parser: argparse.ArgumentParser, number, integer) -> None:
    """The alignment flags; ``number(low)`` and ``integer(low)`` parse checked values."""
    defaults = ReconstructionConfig()
    parser.add_argument(
        "--learn-shift", action="store_true",
        help="learn each tilt's shift (pixels) with the volume; the tilt closest to 0 degrees "
        "(or --reference-tilt) keeps its own",
    )  # fmt: skip
    parser.add_argument(
        "--learn-tilt-axis", action="store_true",
        help="learn the tilt axis's angle in the images with the volume",
    )  # fmt: skip
    parser.add_argument(
        "--lr-pose", type=number(0), metavar="LR", default=defaults.lr_pose,
        help="Adam's learning rate of the shifts",
    )  # fmt: skip
    parser.add_argument(
        "--lr-tilt-axis",
        type=number(0),
        metavar="LR",
        default=defaults.lr_tilt_axis,
        help="Adam's learning rate of the tilt axis",
    )
    parser.add_argument(
        "--pose-tv", type=number(0), metavar="W", default=defaults.pose_tv,
        help="weight of the shifts' total variation across tilts (0: off)",
    )  # fmt: skip
    parser.add_argument(
        "--reference-tilt", type=integer(0), metavar="I", default=None,
        help="index of the tilt whose shift stays fixed (default: the one closest to 0 degrees)",
    )  # fmt: skip
    parser.add_argument(
        "--misalign-shifts", type=number(0), metavar="PX", default=0.0,
        help="built-in phantom only: shift each tilt's image by a random amount up to ±PX pixels "
        "on each axis (the reference tilt stays put), to try --learn-shift",
    )  # fmt: skip
    parser.add_argument(
        "--misalign-tilt-axis", type=number(-90, 90), metavar="DEG", default=0.0,
        help="built-in phantom only: record the series with its tilt axis turned by DEG degrees, "
        "to try --learn-tilt-axis",
    )  # fmt: skip


def misaligned(args: argparse.Namespace, geometry: TiltGeometry) -> TiltGeometry:
    """The phantom's recording geometry: ``geometry`` with the asked-for random shifts (seeded by
    ``--seed``) and turned tilt axis."""
    if not args.misalign_shifts and not args.misalign_tilt_axis:
        return geometry
    g = torch.Generator().manual_seed(args.seed + 7)
    shifts = (torch.rand(geometry.num_tilts, 2, generator=g) * 2 - 1) * args.misalign_shifts
    reference = args.reference_tilt
    if reference is None or not 0 <= reference < geometry.num_tilts:
        reference = int(geometry.angles_deg.abs().argmin())
    shifts[reference] = 0.0
    return TiltGeometry(
        geometry.angles_deg, geometry.detector_shape, shifts, args.misalign_tilt_axis
    )


def pose_config(args: argparse.Namespace) -> dict:
    """The :class:`ReconstructionConfig` settings the alignment flags ask for."""
    return {
        "learn_shift": args.learn_shift,
        "learn_tilt_axis": args.learn_tilt_axis,
        "lr_pose": args.lr_pose,
        "lr_tilt_axis": args.lr_tilt_axis,
        "pose_tv": args.pose_tv,
        "reference_tilt": args.reference_tilt,
    }


def write_pose(
    out: Path,
    result: ReconstructionResult,
    series: torch.Tensor,
    recorded: TiltGeometry | None,
) -> dict:
    """Write ``pose.json`` (per tilt: angle, shifts, tilt axis, reference flag and the RMS residual
    of the aligned projection) and return the metrics' pose entries; with the phantom's
    ``recorded`` geometry, the recovered pose's error against it too."""
    pose = result.pose
    residuals = tilt_residuals(
        result.object_model, pose.rays, series, result.config.samples_per_ray
    ).tolist()
    rows = pose.table()
    for row, residual in zip(rows, residuals):
        row["residual_rms"] = residual
    axis = pose.tilt_axis_deg().detach().float().mean().item()
    metrics: dict = {"pose_tilt_axis_deg": axis, "pose_file": str(out / POSE_FILE)}
    if recorded is not None:
        truth = recorded.shifts if recorded.shifts is not None else torch.zeros(len(rows), 2)
        metrics["pose_shift_error_px"] = shift_error_px(
            pose.shifts().detach().cpu(), truth.cpu(), recorded.angles_deg
        )
        metrics["pose_tilt_axis_error_deg"] = abs(axis - recorded.tilt_axis_deg)
    summary = {
        "reference_tilt": pose.reference_tilt,
        "tilt_axis_deg": axis,
        "learned": {"shift": pose.learn_shift, "tilt_axis": pose.learn_tilt_axis},
        "shift_units": "pixels (du along the detector columns, dv along the rows)",
        "tilts": rows,
    }
    if recorded is not None:
        summary["truth"] = {
            "tilt_axis_deg": recorded.tilt_axis_deg,
            "shifts_px": None if recorded.shifts is None else recorded.shifts.tolist(),
        }
    (out / POSE_FILE).write_text(json.dumps(summary, indent=2))
    return metrics
