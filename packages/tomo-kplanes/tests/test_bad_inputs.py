"""Every public op of tomo-kplanes through the shared bad-input kit (tiny shapes)."""

import pytest
import torch

from tomo_kplanes import project_to_so3
from tomo_kplanes.ops import nearest_rotation, tilted_plane_features
from tomo_kplanes.ops.nearest_rotation import nearest_rotation_reference
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


@pytest.mark.parametrize("case", bad_input_params(TILTED_PLANE_FEATURES))
def test_tilted_plane_features_bad_inputs(case, seed, device):
    check_bad_input(case, seed=seed, device=device)


@pytest.mark.parametrize("case", bad_input_params(NEAREST_ROTATION))
def test_nearest_rotation_bad_inputs(case, seed, device):
    check_bad_input(case, seed=seed, device=device)


@pytest.mark.parametrize("case", bad_input_params(PROJECT_TO_SO3))
def test_project_to_so3_bad_inputs(case, seed, device):
    check_bad_input(case, seed=seed, device=device)
