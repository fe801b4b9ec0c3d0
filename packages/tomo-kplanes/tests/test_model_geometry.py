import math

import pytest
import torch

from tomo_kplanes.geometry import TiltGeometry, project_volume, tilt_range
from tomo_kplanes.model import KPlanes, KPlanesTilted
from tomo_kplanes.ops.tilted_plane_features import tilted_plane_features_reference
from tomo_kplanes.phantoms import nanoparticle_phantom, shepp_logan_3d, simulate_tilt_series
from tomo_kplanes.rotations import project_to_so3


def test_so3_projection_is_a_rotation_with_a_finite_gradient_at_identity(rng):
    # two matrices: each Jacobian column is a kernel launch under the interpreter (the op's own
    # tests check its gradient against the SVD's on larger batches)
    m = (torch.eye(3) + 0.1 * torch.randn(2, 3, 3, generator=rng)).double().requires_grad_()
    assert torch.autograd.gradcheck(project_to_so3, (m,))
    r = project_to_so3(m)
    torch.testing.assert_close(r @ r.transpose(-1, -2), torch.eye(3, dtype=torch.float64).expand(2, 3, 3))
    assert torch.allclose(torch.linalg.det(r), torch.ones(2, dtype=torch.float64))
    eye = torch.eye(3).repeat(2, 1, 1).requires_grad_()
    (project_to_so3(eye) * torch.randn(2, 3, 3, generator=rng)).sum().backward()
    assert torch.isfinite(eye.grad).all()
    # a reflection projects to a proper rotation
    refl = torch.diag(torch.tensor([1.0, 1.0, -1.0]))
    assert torch.linalg.det(project_to_so3(refl)) == pytest.approx(1.0)


def test_kplanes_tilted_matches_a_direct_reference_composition(rng):
    field = KPlanesTilted(6, channels=3, rotations=2, scales=(1.0, 0.5), backend="torch", generator=rng)
    pts = torch.rand(10, 3, generator=rng) * 2 - 1
    rot = project_to_so3(field.rotation_params)
    feats = torch.cat([tilted_plane_features_reference(pts, rot, p) for p in field.planes], dim=1)
    expected = torch.nn.functional.softplus(field.decoder(feats).squeeze(-1) - 1.0)
    torch.testing.assert_close(field(pts), expected)
    assert [p.shape for p in field.planes] == [(6, 3, 6, 6), (6, 3, 3, 3)]


def test_kplanes_is_the_unrotated_single_set():
    field = KPlanes(8, channels=4)
    assert field.num_rotations == 1 and not field.learn_rotations
    assert torch.equal(field.rotations(), torch.eye(3).unsqueeze(0))
    assert field.parameter_groups()["rotations"] == []


def test_model_rejects_bad_settings():
    with pytest.raises(ValueError, match="decoder"):
        KPlanesTilted(8, decoder="transformer")
    with pytest.raises(ValueError, match="resolution"):
        KPlanesTilted(1)
    with pytest.raises(ValueError, match="activation"):
        KPlanesTilted(8, activation="tanh")


def test_rays_are_clipped_to_the_box_and_misses_give_zero():
    geo = TiltGeometry(torch.tensor([0.0, 45.0]), (3, 5), shifts=torch.tensor([[0.0, 0.0], [10.0, 0.0]]))
    pts, step = geo.rays(torch.arange(geo.num_rays), 4)
    # zero tilt: straight down z through the full box, 4 midpoints of 0.5-long steps
    centre = 1 * 5 + 2
    torch.testing.assert_close(step[centre], torch.tensor(0.5))
    torch.testing.assert_close(pts[centre, :, 2], torch.tensor([-0.75, -0.25, 0.25, 0.75]))
    # second tilt shifted 10 pixels along u: every ray misses
    assert torch.equal(step[15:], torch.zeros(15))
    inside = pts[:15].abs() <= 1 + 1e-6
    assert inside.all()


def test_projection_of_a_uniform_cube_is_the_chord_length():
    geo = TiltGeometry(torch.tensor([0.0, 30.0, -60.0]), (9, 9))
    proj = project_volume(torch.ones(17, 17, 17), geo, n_samples=64)
    # centre ray at angle θ crosses the cube (side 2) over 2 / cos θ while |tan θ| <= 1
    torch.testing.assert_close(proj[0, 4, 4], torch.tensor(2.0), atol=1e-4, rtol=0)
    torch.testing.assert_close(proj[1, 4, 4], torch.tensor(2 / math.cos(math.radians(30))), atol=1e-4, rtol=0)
    torch.testing.assert_close(proj[2, 4, 4], torch.tensor(2 / math.sin(math.radians(60))), atol=1e-4, rtol=0)


def test_geometry_rejects_bad_input():
    with pytest.raises(ValueError, match="angles"):
        TiltGeometry(torch.tensor([]), (4, 4))
    with pytest.raises(ValueError, match="shifts"):
        TiltGeometry(torch.tensor([0.0, 1.0]), (4, 4), shifts=torch.zeros(3, 2))
    with pytest.raises(ValueError, match="detector_shape"):
        TiltGeometry(torch.tensor([0.0]), (1, 4))
    assert tilt_range(60, 2).numel() == 61


def test_phantoms_are_seeded_and_noise_is_unbiased():
    sl = shepp_logan_3d(16)
    assert sl.shape == (16, 16, 16) and sl.max() == pytest.approx(1.0) and sl.min() >= 0
    a, b = nanoparticle_phantom(16, seed=3), nanoparticle_phantom(16, seed=3)
    assert torch.equal(a, b) and not torch.equal(a, nanoparticle_phantom(16, seed=4))
    geo = TiltGeometry(tilt_range(60, 30), (16, 16))
    clean = simulate_tilt_series(sl, geo)
    noisy = simulate_tilt_series(sl, geo, dose=1e4, seed=1)
    assert not torch.equal(clean, noisy)
    assert torch.equal(noisy, simulate_tilt_series(sl, geo, dose=1e4, seed=1))
    assert abs(noisy.mean() - clean.mean()) < 0.02 * clean.mean()
