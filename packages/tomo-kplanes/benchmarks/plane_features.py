"""The fused op alone vs grid_sample: forward and forward+backward at 204,800 points (T=4, C=32,
200×200 planes), float32."""

from __future__ import annotations

import torch

from tomo_kplanes.ops import tilted_plane_features
from tomo_kplanes.ops.tilted_plane_features import tilted_plane_features_reference
from triton_dispatch.bench import benchmark_arguments, compare, report


def main() -> None:
    args = benchmark_arguments(__doc__).parse_args()
    device = torch.device(args.device)
    n, t, c, res = (4096, 2, 8, 32) if args.quick else (204_800, 4, 32, 200)
    g = torch.Generator().manual_seed(0)
    points = (torch.rand(n, 3, generator=g) * 2 - 1).to(device)
    rot = (torch.eye(3) + 0.05 * torch.randn(t, 3, 3, generator=g)).to(device)
    planes = torch.rand(3 * t, c, res, res, generator=g).to(device)
    planes_cl = planes.contiguous(memory_format=torch.channels_last).requires_grad_()
    planes = planes.requires_grad_()
    rot.requires_grad_()
    up = torch.randn(n, t * c, generator=g).to(device)
    compiled_ref = torch.compile(tilted_plane_features_reference)
    shape = {"N": n, "T": t, "C": c, "H": res, "W": res}
    records = []

    def fwd(fn, p):
        def run():
            with torch.no_grad():
                return fn(points, rot, p)
        return run

    def fwd_bwd(fn, p):
        def run():
            out = fn(points, rot, p)
            torch.autograd.grad(out, (rot, p), up)
        return run

    baselines = [("grid_sample", tilted_plane_features_reference)]
    if device.type == "cuda":
        baselines.append(("grid_sample+compile", compiled_ref))
    for bname, bfn in baselines:
        records.append(compare("forward", shape, ours=fwd(tilted_plane_features, planes_cl),
                               baseline=fwd(bfn, planes), baseline_name=bname, device=device))
        records.append(compare("forward+backward", shape, ours=fwd_bwd(tilted_plane_features, planes_cl),
                               baseline=fwd_bwd(bfn, planes), baseline_name=bname, device=device))
    report(records, args.out, meta={"script": "plane_features.py", "quick": args.quick})


if __name__ == "__main__":
    main()
