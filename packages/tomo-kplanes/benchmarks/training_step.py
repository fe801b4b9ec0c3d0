"""One full training step (forward, backward, Adam) of the 200³ configuration: T=4 rotations,
C=32, one scale, linear decoder, 1024 rays × 200 samples, volume TV on 10,000 points × 4 taps.
Cases: the PyTorch grid_sample path and the fused op, each with two model calls (main batch, then
taps) and with the taps folded into one call. Peak memory of each. Both paths use fused Adam on
CUDA. The PyTorch path is what a PyTorch user would write: ``grid_sample``, the SVD projection of
the rotations, the loss as plain PyTorch ops (``backend="torch"``: ``ray_loss``'s reference) and the
plane TV ``torch.compile``d on CUDA (as in the earlier runs of BENCHMARKS.md). The fused path runs
the Triton kernels for all of them (``tilted_plane_features``, ``nearest_rotation``, ``ray_loss``,
``plane_tv``). On CUDA a last case replays the fused folded step as one CUDA graph
(``CapturedStep``, what ``reconstruct`` runs on CUDA), and two more compare the step with the tilt
series' pose learned (``TiltPose``: per-tilt shifts and the tilt axis, rays cast through it inside
the step) against the same graphed step casting its rays from the fixed geometry."""

from __future__ import annotations

import torch

from tomo_kplanes.geometry import TiltGeometry, tilt_range
from tomo_kplanes.graphed import CapturedStep, prepare_optimizer_for_capture
from tomo_kplanes.model import KPlanesTilted
from tomo_kplanes.objective import (
    LossWeights,
    ReconstructionContext,
    TomographyObject,
    reconstruction_loss,
)
from tomo_kplanes.ops.plane_tv import plane_tv_reference
from tomo_kplanes.pose import TiltPose
from triton_dispatch.bench import benchmark_arguments, compare, report


def make_step(
    res,
    channels,
    rotations,
    rays,
    samples,
    tv_points,
    *,
    fused,
    fold,
    device,
    graph=False,
    fused_adam=None,
    rays_in_step=False,
    pose=False,
):
    """One training step as ``reconstruct`` runs it. ``fused_adam``: ``None`` means on CUDA
    (what ``reconstruct`` does); ``True`` also on the host (``step_launches.py`` counts the CUDA
    step's launches there). ``rays_in_step``: cast the rays inside the step, as ``reconstruct``
    does; ``pose``: cast them through a learned ``TiltPose`` (shifts and tilt axis)."""
    g = torch.Generator().manual_seed(0)
    field = KPlanesTilted(
        res,
        channels,
        rotations=rotations,
        backend=None if fused else "torch",
        channels_last=fused,
        generator=g,
    )
    obj = TomographyObject(field).to(device)
    if not fused and torch.device(device).type == "cuda":
        compiled = torch.compile(plane_tv_reference, fullgraph=True, dynamic=False)
        field.plane_tv = lambda: compiled(field.planes[0])  # one scale
    # both paths use what reconstruct() uses: fused Adam on CUDA
    if fused_adam is None:
        fused_adam = torch.device(device).type == "cuda"
    geo = TiltGeometry(tilt_range(60, 2), (res, res)).to(device)
    groups = [{"params": list(obj.parameters()), "lr": 1e-3}]
    cast = geo.rays
    if pose:
        learned = TiltPose(geo)
        groups.append({"params": learned.learned_parameters(), "lr": 5e-2})
        cast = learned.rays
    opt = torch.optim.Adam(groups, fused=fused_adam)
    idx = torch.randint(0, geo.num_rays, (rays,), generator=g).to(device)
    points, steps = geo.rays(idx, samples)
    target = torch.rand(rays, generator=g).to(device)
    weights = LossWeights(volume_tv=1e-3, plane_tv=1e-4)
    gen = torch.Generator(device=device).manual_seed(0)

    def step():
        nonlocal points, steps
        if rays_in_step or pose:
            points, steps = cast(idx, samples)
        ctx = ReconstructionContext(
            tv_tap_points=obj.sample_tv_tap_coords(tv_points, generator=gen, device=device)
        )
        loss, _ = reconstruction_loss(obj, points, steps, target, weights, ctx, fold_taps=fold)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    if not graph:
        return step
    # (the SVD of the grid_sample path synchronises with the host, which capture forbids)
    prepare_optimizer_for_capture(opt)
    return CapturedStep(step, generators=[gen])


def main() -> None:
    args = benchmark_arguments(__doc__).parse_args()
    device = torch.device(args.device)
    cfg = (32, 8, 2, 128, 32, 1000) if args.quick else (200, 32, 4, 1024, 200, 10_000)
    res, c, t, rays, samples, tv = cfg
    shape = {"res": res, "C": c, "T": t, "rays": rays, "samples": samples, "tv_points": tv}
    records = []
    for fold in (False, True):
        label = "folded taps" if fold else "two calls"
        records.append(
            compare(
                f"train step, {label}",
                shape,
                ours=make_step(*cfg, fused=True, fold=fold, device=device),
                baseline=make_step(*cfg, fused=False, fold=fold, device=device),
                baseline_name=f"grid_sample, {label}",
                device=device,
            )
        )
    # the headline: fused folded against the best PyTorch step (grid_sample folded)
    records.append(
        compare(
            "fused folded vs grid_sample two calls",
            shape,
            ours=make_step(*cfg, fused=True, fold=True, device=device),
            baseline=make_step(*cfg, fused=False, fold=False, device=device),
            baseline_name="grid_sample, two calls",
            device=device,
        )
    )
    if device.type == "cuda":
        records.append(
            compare(
                "train step, folded taps, CUDA graph",
                shape,
                ours=make_step(*cfg, fused=True, fold=True, device=device, graph=True),
                baseline=make_step(*cfg, fused=False, fold=True, device=device),
                baseline_name="grid_sample, folded taps",
                device=device,
            )
        )
    if device.type == "cuda":
        for graph in (False, True):
            label = "CUDA graph" if graph else "eager"
            records.append(
                compare(
                    f"train step with pose learning, {label}",
                    shape,
                    ours=make_step(*cfg, fused=True, fold=True, device=device, graph=graph, pose=True),
                    baseline=make_step(
                        *cfg, fused=True, fold=True, device=device, graph=graph, rays_in_step=True
                    ),
                    baseline_name=f"fused step without pose, {label}",
                    device=device,
                )
            )
    report(
        records,
        args.out,
        meta={"script": "training_step.py", "quick": args.quick, "target_ms_h100": 2.5},
    )


if __name__ == "__main__":
    main()
