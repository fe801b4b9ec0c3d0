"""Every public op of tomo-kplanes through the shared bad-input kit (tiny shapes)."""

import pytest
import torch

from tomo_kplanes import (
    TiltGeometry,
    project_to_so3,
    project_volume,
    psnr,
    simulate_tilt_series,
    sirt,
    ssim,
)
from tomo_kplanes.ops import nearest_rotation, plane_tv, ray_loss, tilted_plane_features
from tomo_kplanes.ops.nearest_rotation import nearest_rotation_reference
from tomo_kplanes.ops.plane_tv import plane_tv_reference
from tomo_kplanes.ops.ray_loss import ray_loss_reference
from tomo_kplanes.ops.tilted_plane_features import tilted_plane_features_reference
from triton_dispatch.testing import OpSpec, TensorArg, bad_input_params, check_bad_input, randn

FLOATS = (torch.float32, torch.float64)


def _features_inputs(gen):
    return {
        "points": randn((5, 3), generator=gen, scale=0.6),
        "rotations": randn((1, 3, 3), generator=gen),
        "planes": randn((3, 2, 4, 4), generator=gen),
    }


TILTED_PLANE_FEATURES = OpSpec(
    "tilted_plane_features",
    tilted_plane_features,
    tilted_plane_features_reference,
    _features_inputs,
    [
        TensorArg("points", dtypes=FLOATS),
        TensorArg("rotations", dtypes=FLOATS),
        TensorArg("planes", dtypes=FLOATS),
    ],
    # a product of three bilinear reads in fp32: one point's features (the stride-0 case repeats
    # a single point) can be off by a few 1e-5 relative where a factor is small
    tol=1e-4,
)

NEAREST_ROTATION = OpSpec(
    "nearest_rotation",
    nearest_rotation,
    nearest_rotation_reference,
    lambda gen: {"matrices": randn((2, 3, 3), generator=gen) + 2 * torch.eye(3)},
    [TensorArg("matrices", ranks=(2, 3, 4), dtypes=FLOATS)],
    tol=1e-4,  # an iterative polar decomposition against an fp64 SVD
)


# the public name of the same op (tomo_kplanes.project_to_so3 wraps nearest_rotation)
PROJECT_TO_SO3 = OpSpec(
    "project_to_so3",
    project_to_so3,
    nearest_rotation_reference,
    NEAREST_ROTATION.make_inputs,
    NEAREST_ROTATION.args,
    tol=NEAREST_ROTATION.tol,
)


def _ray_loss_inputs(gen):
    return {
        "densities": randn((3 * 4 + 4 * 5,), generator=gen),
        "points": randn((3, 4, 3), generator=gen, scale=0.8),
        "steps": randn((3,), generator=gen).abs(),
        "target": randn((3,), generator=gen).abs(),
        "plane_tv": randn((), generator=gen).abs(),
    }


# the shapes of densities, points, steps and target follow from each other: a mismatch is
# reported on whichever of them is checked second
_RAY_SHAPES = ("densities", "points", "steps", "target")
RAY_LOSS = OpSpec(
    "ray_loss",
    ray_loss,
    ray_loss_reference,
    _ray_loss_inputs,
    [
        TensorArg(name, dtypes=FLOATS, related=tuple(n for n in _RAY_SHAPES if n != name))
        for name in _RAY_SHAPES
    ]
    + [TensorArg("plane_tv", dtypes=FLOATS)],
    kwargs={"tv_step": 0.25, "volume_tv_weight": 0.1, "plane_tv_weight": 0.01, "shrinkage": 0.05},
    tol=1e-4,  # fp32 sums in another order than the float64 reference's
)

PLANE_TV = OpSpec(
    "plane_tv",
    plane_tv,
    plane_tv_reference,
    lambda gen: {"planes": randn((5, 6), generator=gen)},
    [TensorArg("planes", ranks=(2, 3, 4), dtypes=FLOATS)],
    tol=1e-4,
)


@pytest.mark.parametrize("case", bad_input_params(RAY_LOSS))
def test_ray_loss_bad_inputs(case, seed, device):
    check_bad_input(case, seed=seed, device=device)


@pytest.mark.parametrize("case", bad_input_params(PLANE_TV))
def test_plane_tv_bad_inputs(case, seed, device):
    check_bad_input(case, seed=seed, device=device)


@pytest.mark.parametrize("case", bad_input_params(TILTED_PLANE_FEATURES))
def test_tilted_plane_features_bad_inputs(case, seed, device):
    check_bad_input(case, seed=seed, device=device)


@pytest.mark.parametrize("case", bad_input_params(NEAREST_ROTATION))
def test_nearest_rotation_bad_inputs(case, seed, device):
    check_bad_input(case, seed=seed, device=device)


@pytest.mark.parametrize("case", bad_input_params(PROJECT_TO_SO3))
def test_project_to_so3_bad_inputs(case, seed, device):
    check_bad_input(case, seed=seed, device=device)


# The utilities below are plain PyTorch (no kernel): each is its own float64 reference, so the kit
# checks that hostile inputs get a clear error or the same answer as clean float64 inputs.
def _geometry():
    return TiltGeometry(torch.tensor([-30.0, 0.0, 30.0]), (6, 5))


def _project(volume):
    return project_volume(volume, _geometry(), n_samples=8)


PROJECT_VOLUME = OpSpec(
    "project_volume",
    _project,
    _project,
    lambda gen: {"volume": randn((4, 6, 5), generator=gen)},
    [TensorArg("volume", dtypes=FLOATS)],
)


def _simulate(volume):
    return simulate_tilt_series(volume, _geometry(), n_samples=8)


SIMULATE_TILT_SERIES = OpSpec(
    "simulate_tilt_series",
    _simulate,
    _simulate,
    lambda gen: {"volume": randn((4, 6, 5), generator=gen).abs()},
    [TensorArg("volume", dtypes=FLOATS)],
)


def _sirt(tilt_series):
    return sirt(tilt_series, _geometry(), (4, 6, 5), iterations=2, n_samples=8)


SIRT = OpSpec(
    "sirt",
    _sirt,
    _sirt,
    lambda gen: {"tilt_series": randn((3, 6, 5), generator=gen).abs()},
    [TensorArg("tilt_series", dtypes=FLOATS)],
    tol=1e-4,  # two iterations of back-projections in fp32
)


def _metric_inputs(gen):
    truth = randn((12, 12, 13), generator=gen)  # ssim needs 11 voxels per side
    return {"truth": truth, "estimate": truth + 0.1 * randn((12, 12, 13), generator=gen)}


def _as_tensor(fn):
    """The metrics return Python floats; the kit compares tensors."""
    return lambda truth, estimate: torch.tensor(fn(truth, estimate), dtype=torch.float64)


METRICS = [
    OpSpec(
        name,
        _as_tensor(fn),
        _as_tensor(fn),
        _metric_inputs,
        [TensorArg("truth", dtypes=FLOATS), TensorArg("estimate", dtypes=FLOATS)],
        tol=1e-4,
    )
    for name, fn in (("psnr", psnr), ("ssim", ssim))
]


@pytest.mark.parametrize(
    "case",
    [
        p
        for spec in (PROJECT_VOLUME, SIMULATE_TILT_SERIES, SIRT, *METRICS)
        for p in bad_input_params(spec)
    ],
)
def test_pytorch_utilities_bad_inputs(case, seed, device):
    check_bad_input(case, seed=seed, device=device)
