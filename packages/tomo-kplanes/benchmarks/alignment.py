"""Learning a misaligned tilt series' pose: both built-in phantoms recorded with random per-tilt
shifts (uniform in ±``--shift`` pixels on each axis, the 0° tilt unshifted) and the tilt axis
turned by ``--axis`` degrees, reconstructed three ways with the same settings:

* ``aligned``: the series recorded without misalignment (the target quality);
* ``misaligned``: the misaligned series, no pose learning (what a user got before);
* ``learned``: the misaligned series with ``learn_shift`` and ``learn_tilt_axis``.

Reported per phantom: PSNR / SSIM of each against the phantom, the learned pose's shift error
(RMS pixels, after removing the rigid move of the volume the shifts cannot pin,
``tomo_kplanes.pose.shift_error_px``) and tilt-axis error, and the run's wall time.

    PYTHONPATH=shared/triton-dispatch/src:packages/tomo-kplanes/src \\
        python3 packages/tomo-kplanes/benchmarks/alignment.py --size 128 --steps 3000 --out a.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from tomo_kplanes.geometry import TiltGeometry, tilt_range
from tomo_kplanes.metrics import psnr, ssim
from tomo_kplanes.phantoms import nanoparticle_phantom, shepp_logan_3d, simulate_tilt_series
from tomo_kplanes.pose import shift_error_px
from tomo_kplanes.train import ReconstructionConfig, reconstruct, render_volume


def _run(truth, series, geometry, config, scale):
    if truth.is_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = reconstruct(series / scale, geometry, config)
    volume = render_volume(result.object_model, tuple(truth.shape)) * scale
    wall = time.perf_counter() - t0
    row = {"psnr": psnr(truth, volume), "ssim": ssim(truth, volume), "seconds": wall}
    return row, result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=48)
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--shift", type=float, default=3.0)
    p.add_argument("--axis", type=float, default=1.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--phantoms", nargs="+", default=["shepp-logan", "nanoparticle"])
    p.add_argument("--out", default="alignment.json")
    args = p.parse_args()
    device = torch.device(args.device)
    angles = tilt_range(60, 3)
    shape = (args.size, args.size)
    g = torch.Generator().manual_seed(args.seed)
    shifts = (torch.rand(len(angles), 2, generator=g) * 2 - 1) * args.shift
    shifts[int(angles.abs().argmin())] = 0.0
    aligned_geo = TiltGeometry(angles, shape)
    recorded = TiltGeometry(angles, shape, shifts, args.axis)
    config = ReconstructionConfig(steps=args.steps, progress=False, seed=args.seed)
    report = {"size": args.size, "steps": args.steps, "shift_px": args.shift, "axis_deg": args.axis,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "phantoms": {}}  # fmt: skip
    for name in args.phantoms:
        if name == "shepp-logan":
            truth = shepp_logan_3d(args.size, device=device)
        else:
            truth = nanoparticle_phantom(args.size, seed=args.seed, device=device)
        clean = simulate_tilt_series(truth, aligned_geo)
        off = simulate_tilt_series(truth, recorded)
        scale = float(clean.abs().amax())
        rows = {}
        rows["aligned"], _ = _run(truth, clean, aligned_geo, config, scale)
        rows["misaligned"], _ = _run(truth, off, aligned_geo, config, scale)
        learn = ReconstructionConfig(steps=args.steps, progress=False, seed=args.seed,
                                     learn_shift=True, learn_tilt_axis=True)  # fmt: skip
        rows["learned"], result = _run(truth, off, aligned_geo, learn, scale)
        pose = result.pose
        rows["learned"]["shift_error_px"] = shift_error_px(pose.shifts().detach().cpu(), shifts, angles)
        rows["learned"]["tilt_axis_deg"] = float(pose.tilt_axis_deg().detach())
        rows["learned"]["tilt_axis_error_deg"] = abs(rows["learned"]["tilt_axis_deg"] - args.axis)
        rows["misaligned"]["shift_error_px"] = shift_error_px(torch.zeros_like(shifts), shifts, angles)
        report["phantoms"][name] = rows
        print(name, json.dumps(rows), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
