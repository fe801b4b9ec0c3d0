import pytest
import torch

from tomo_kplanes.ops import tilted_plane_features
from tomo_kplanes.ops.tilted_plane_features import tilted_plane_features_reference
from triton_dispatch.testing import assert_close, assert_gradients_match


def _inputs(rng, n, t, c, h, w, *, dtype=torch.float64, spread=1.3, device="cpu", channels_last=False):
    points = (torch.rand(n, 3, generator=rng, dtype=torch.float64) * 2 - 1) * spread
    rot = torch.eye(3, dtype=torch.float64) + 0.4 * torch.randn(t, 3, 3, generator=rng, dtype=torch.float64)
    planes = torch.randn(3 * t, c, h, w, generator=rng, dtype=torch.float64)
    if channels_last:
        planes = planes.contiguous(memory_format=torch.channels_last)
    return [x.to(device=device, dtype=dtype).requires_grad_() for x in (points, rot, planes)]


@pytest.mark.parametrize(
    ("n", "t", "c", "h", "w"),
    [(37, 1, 3, 5, 7), (40, 3, 5, 6, 9), (19, 2, 1, 2, 3), (25, 1, 4, 1, 5)],
)
def test_values_and_gradients_match_grid_sample_in_float64(rng, device, n, t, c, h, w):
    inputs = _inputs(rng, n, t, c, h, w, device=device)
    errors = assert_gradients_match(
        tilted_plane_features,
        tilted_plane_features_reference,
        inputs,
        names=["points", "rotations", "planes"],
        generator=rng,
    )
    assert set(errors) == {"out0", "grad_points", "grad_rotations", "grad_planes"}


def test_float32_channels_last_planes_match_float64_reference(rng, device):
    inputs = _inputs(rng, 50, 2, 6, 7, 5, dtype=torch.float32, device=device, channels_last=True)
    assert_gradients_match(
        tilted_plane_features,
        tilted_plane_features_reference,
        inputs,
        tol=1e-5,
        grad_tol=1e-4,
        names=["points", "rotations", "planes"],
        generator=rng,
    )


def test_clamped_coordinates_have_exactly_zero_point_gradient(rng, device):
    # every rotated coordinate lies outside [-1, 1]: the border clamp is active on both plane axes
    points = torch.tensor([[1.5, -2.0, 3.0], [-1.2, 1.7, -1.1]], dtype=torch.float64, device=device)
    points.requires_grad_()
    rot = torch.eye(3, dtype=torch.float64, device=device).unsqueeze(0).requires_grad_()
    planes = torch.randn(3, 4, 5, 6, generator=rng, dtype=torch.float64).to(device).requires_grad_()
    out = tilted_plane_features(points, rot, planes)
    ref = tilted_plane_features_reference(points, rot, planes)
    assert_close(out, ref)
    out.sum().backward()
    assert torch.equal(points.grad, torch.zeros_like(points))
    assert torch.equal(rot.grad, torch.zeros_like(rot))
    assert planes.grad.abs().sum() > 0


def test_only_plane_gradient_when_points_and_rotations_are_constants(rng, device):
    points, rot, planes = _inputs(rng, 30, 2, 3, 4, 4, device=device)
    points.requires_grad_(False)
    rot.requires_grad_(False)
    assert_gradients_match(
        tilted_plane_features, tilted_plane_features_reference, [points, rot, planes], generator=rng
    )


def test_output_layout_is_rotation_major(rng, device):
    points, rot, planes = (x.detach() for x in _inputs(rng, 9, 3, 2, 4, 5, device=device))
    out = tilted_plane_features(points, rot, planes)
    for t in range(3):
        single = tilted_plane_features_reference(points, rot[t : t + 1], planes[3 * t : 3 * t + 3])
        assert_close(out[:, 2 * t : 2 * t + 2], single)


def test_axis_convention_of_each_plane(device):
    # a plane that varies only along W (resp. H) exposes which rotated coordinate it reads
    w = 5
    ramp = torch.linspace(-1, 1, w, dtype=torch.float64, device=device)
    ones = torch.ones(1, 1, w, w, dtype=torch.float64, device=device)
    along_w = ramp.view(1, 1, 1, w).expand(1, 1, w, w)
    along_h = ramp.view(1, 1, w, 1).expand(1, 1, w, w)
    p = torch.tensor([[0.25, -0.5, 0.75]], dtype=torch.float64, device=device)
    eye = torch.eye(3, dtype=torch.float64, device=device).unsqueeze(0)
    cases = {  # (plane k, varies along): coordinate read
        (0, "w"): 0.25, (0, "h"): -0.5, (1, "w"): 0.75, (1, "h"): 0.25, (2, "w"): -0.5, (2, "h"): 0.75,
    }
    for (k, axis), expected in cases.items():
        planes = [ones, ones, ones]
        planes[k] = along_w if axis == "w" else along_h
        out = tilted_plane_features(p, eye, torch.cat(planes).contiguous())
        assert out.item() == pytest.approx(expected, abs=1e-12)


def test_empty_point_set(device):
    points = torch.empty(0, 3, device=device, requires_grad=True)
    rot = torch.eye(3, device=device).unsqueeze(0)
    planes = torch.randn(3, 4, 5, 5, device=device, requires_grad=True)
    out = tilted_plane_features(points, rot, planes)
    assert out.shape == (0, 4)
    out.sum().backward()
    assert torch.equal(planes.grad, torch.zeros_like(planes))


@pytest.mark.parametrize(
    ("points", "rotations", "planes", "error", "match"),
    [
        ((5, 2), (1, 3, 3), (3, 2, 4, 4), ValueError, "points"),
        ((5, 3), (3, 3), (3, 2, 4, 4), ValueError, "rotations"),
        ((5, 3), (2, 3, 3), (3, 2, 4, 4), ValueError, "planes"),
        ((5, 3), (1, 3, 3), (3, 0, 4, 4), ValueError, "planes"),
    ],
)
def test_bad_shapes_raise(points, rotations, planes, error, match):
    with pytest.raises(error, match=match):
        tilted_plane_features(torch.zeros(points), torch.zeros(rotations), torch.zeros(planes))


def test_bad_dtypes_raise():
    with pytest.raises(TypeError, match="share one dtype"):
        tilted_plane_features(
            torch.zeros(2, 3, dtype=torch.float64), torch.zeros(1, 3, 3), torch.zeros(3, 1, 2, 2)
        )
    with pytest.raises(TypeError, match="floating-point"):
        tilted_plane_features(
            torch.zeros(2, 3, dtype=torch.int64), torch.zeros(1, 3, 3), torch.zeros(3, 1, 2, 2)
        )
    for dtype in (torch.bfloat16, torch.float16):
        for backend in (None, "torch"):  # refused the same way whichever backend would run
            with pytest.raises(TypeError, match="float32 or float64"):
                tilted_plane_features(
                    torch.zeros(2, 3, dtype=dtype), torch.zeros(1, 3, 3, dtype=dtype),
                    torch.zeros(3, 1, 2, 2, dtype=dtype), backend=backend,
                )


def test_custom_op_registrations_pass_opcheck(rng, device):
    points, rot, planes = _inputs(rng, 12, 2, 3, 4, 5, device=device)
    torch.library.opcheck(
        torch.ops.tomo_kplanes.tilted_plane_features.default,
        (points, rot, planes),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_static"),
    )


def test_traces_under_torch_compile_fullgraph(rng, device):
    points, rot, planes = _inputs(rng, 20, 2, 3, 4, 5, device=device)
    compiled = torch.compile(tilted_plane_features, fullgraph=True, backend="aot_eager")
    out = compiled(points, rot, planes)
    out.square().sum().backward()
    ref_inputs = [x.detach().clone().requires_grad_() for x in (points, rot, planes)]
    ref = tilted_plane_features_reference(*ref_inputs)
    ref.square().sum().backward()
    assert_close(out, ref)
    for x, r in zip((points, rot, planes), ref_inputs):
        assert_close(x.grad, r.grad)


@pytest.mark.gpu
def test_inductor_compile_on_cuda_matches_reference(rng):
    points, rot, planes = _inputs(rng, 4096, 4, 32, 64, 64, dtype=torch.float32, device="cuda", channels_last=True)
    compiled = torch.compile(lambda p, r, pl: tilted_plane_features(p, r, pl).sum(dim=1), fullgraph=True)
    out = compiled(points, rot, planes)
    ref = tilted_plane_features_reference(*(x.detach().double() for x in (points, rot, planes))).sum(1)
    assert_close(out, ref, tol=1e-5)
    out.sum().backward()
    assert torch.isfinite(planes.grad).all() and torch.isfinite(rot.grad).all()


def _nan_case(rng, device, *, bad_point: bool):
    points, rot, planes = (x.detach() for x in _inputs(rng, 20, 2, 3, 4, 5, device=device))
    if bad_point:
        points[3, 1] = float("nan")
        points[7, 2] = float("inf")
    else:
        rot[1, 2, 0] = float("nan")
    return [x.requires_grad_() for x in (points, rot, planes)]


@pytest.mark.parametrize("bad_point", [True, False], ids=["bad-points", "bad-rotation"])
def test_non_finite_coordinates_give_nan_features_and_no_gradient(rng, device, bad_point):
    inputs = _nan_case(rng, device, bad_point=bad_point)
    ref_inputs = [x.detach().clone().requires_grad_() for x in inputs]
    out = tilted_plane_features(*inputs)
    ref = tilted_plane_features_reference(*ref_inputs)
    bad = torch.zeros_like(out, dtype=torch.bool)
    if bad_point:
        bad[[3, 7]] = True  # every rotation mixes the bad coordinate into all three of q's
    else:
        bad[:, 3:] = True  # rotation 1's columns
    assert torch.equal(torch.isnan(out), bad)
    assert torch.equal(torch.isnan(ref), bad)
    assert_close(out[~bad], ref[~bad])
    # an upstream gradient that is NaN on the bad entries must not leak into any gradient
    up = torch.randn(out.shape, generator=rng, dtype=out.dtype).to(device)
    up = torch.where(bad, torch.full_like(up, float("nan")), up)
    grads = torch.autograd.grad(out, inputs, up)
    ref_grads = torch.autograd.grad(ref, ref_inputs, up)
    for name, g, r in zip(("points", "rotations", "planes"), grads, ref_grads):
        assert torch.isfinite(g).all(), name
        assert_close(g, r, name=f"grad_{name}")
    if bad_point:
        assert torch.equal(grads[0][[3, 7]], torch.zeros(2, 3, dtype=out.dtype, device=device))
    else:
        assert torch.equal(grads[1][1], torch.zeros(3, 3, dtype=out.dtype, device=device))


def test_kernels_write_every_element_of_poisoned_buffers(monkeypatch, rng, device):
    from triton_dispatch.testing import poison_

    real_empty = torch.empty

    def poisoned_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return poison_(t) if t.is_floating_point() else t

    # the launchers allocate their outputs with torch.empty: fill them with NaN first
    monkeypatch.setattr(torch, "empty", poisoned_empty)
    inputs = _inputs(rng, 33, 2, 3, 4, 6, device=device)
    assert_gradients_match(
        tilted_plane_features, tilted_plane_features_reference, inputs,
        names=["points", "rotations", "planes"], generator=rng,
    )


@pytest.mark.parametrize("runs", [True, False], ids=["run-reduced", "plain-atomics"])
def test_ray_ordered_points_with_repeated_cells(monkeypatch, rng, device, runs):
    # samples along rays (many consecutive points in one cell of some plane), exact repeats, a NaN
    # point inside a run, and runs that cross the kernel's block boundaries
    from tomo_kplanes.ops.tilted_plane_features import backward

    monkeypatch.setattr(backward, "PRE_REDUCE_RUNS", runs)
    starts = torch.rand(3, 3, generator=rng, dtype=torch.float64) * 2 - 1
    starts[:, 2] = -1.1
    along = torch.linspace(0, 2.2, 15, dtype=torch.float64)
    rays = (starts[:, None, :] + along[None, :, None] * torch.tensor([0.0, 0.02, 1.0])).reshape(-1, 3)
    repeats = torch.rand(1, 3, generator=rng, dtype=torch.float64).expand(6, 3)
    points = torch.cat([rays, repeats]).to(device)
    points[20, 0] = float("nan")
    rot = (torch.eye(3, dtype=torch.float64) + 0.01 * torch.randn(2, 3, 3, generator=rng, dtype=torch.float64))
    planes = torch.randn(6, 3, 4, 5, generator=rng, dtype=torch.float64)
    inputs = [x.to(device).requires_grad_() for x in (points, rot, planes)]
    ref_inputs = [x.detach().clone().requires_grad_() for x in inputs]
    out = tilted_plane_features(*inputs)
    ref = tilted_plane_features_reference(*ref_inputs)
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    ok = ~torch.isnan(ref)
    assert_close(out[ok], ref[ok])
    up = torch.randn(out.shape, generator=rng, dtype=torch.float64).to(device)
    for name, g, r in zip(
        ("points", "rotations", "planes"),
        torch.autograd.grad(out, inputs, up),
        torch.autograd.grad(ref, ref_inputs, up),
    ):
        assert_close(g, r, name=f"grad_{name}")
