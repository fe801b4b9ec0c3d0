"""``tilted_plane_features_with_tv`` (the plane TV's gradient folded into the features' backward)
against the float64 references and against the two ops it replaces."""

import pytest
import torch

from tomo_kplanes import model
from tomo_kplanes.geometry import TiltGeometry
from tomo_kplanes.model import KPlanesTilted
from tomo_kplanes.objective import (
    LossWeights,
    ReconstructionContext,
    TomographyObject,
    reconstruction_loss,
)
from tomo_kplanes.ops import plane_tv, tilted_plane_features, tilted_plane_features_with_tv
from tomo_kplanes.ops.tilted_plane_features_with_tv import tilted_plane_features_with_tv_reference
from triton_dispatch.testing import assert_close, assert_gradients_match, poison_

NAMES = ["points", "rotations", "planes"]


def _inputs(rng, n, t, c, h, w, *, dtype=torch.float64, device="cpu", channels_last=True):
    points = torch.rand(n, 3, generator=rng, dtype=torch.float64) * 2.6 - 1.3
    tilt = torch.randn(t, 3, 3, generator=rng, dtype=torch.float64)
    rot = torch.eye(3, dtype=torch.float64) + 0.4 * tilt
    planes = torch.randn(3 * t, c, h, w, generator=rng, dtype=torch.float64)
    if channels_last:
        planes = planes.contiguous(memory_format=torch.channels_last)
    return [x.to(device=device, dtype=dtype).requires_grad_() for x in (points, rot, planes)]


def _apart(points, rotations, planes):
    return tilted_plane_features(points, rotations, planes), plane_tv(planes)


@pytest.mark.parametrize(
    ("n", "t", "c", "h", "w", "channels_last"),
    [
        (37, 1, 3, 5, 7, True),
        (40, 2, 5, 6, 4, False),
        (19, 2, 1, 2, 3, True),
        (0, 1, 2, 3, 3, True),
    ],
)
def test_values_and_gradients_match_the_float64_reference(
    rng, device, n, t, c, h, w, channels_last
):
    inputs = _inputs(rng, n, t, c, h, w, device=device, channels_last=channels_last)
    errors = assert_gradients_match(
        tilted_plane_features_with_tv, tilted_plane_features_with_tv_reference, inputs,
        names=NAMES, generator=rng,
    )  # fmt: skip
    # both outputs carry a random upstream gradient, so the folded plane gradient has both parts
    assert set(errors) == {"out0", "out1", "grad_points", "grad_rotations", "grad_planes"}
    assert inputs[2].grad.stride() == inputs[2].stride()


def test_float32_matches_the_float64_reference_and_the_two_ops(rng, device):
    inputs = _inputs(rng, 60, 2, 4, 9, 8, dtype=torch.float32, device=device)
    assert_gradients_match(
        tilted_plane_features_with_tv, tilted_plane_features_with_tv_reference, inputs,
        tol=1e-5, grad_tol=1e-4, names=NAMES, generator=rng,
    )  # fmt: skip
    folded = [x.grad for x in inputs]
    apart_inputs = [x.detach().clone().requires_grad_() for x in inputs]
    features, tv = tilted_plane_features_with_tv(*(x.detach() for x in inputs))
    ref_features, ref_tv = _apart(*apart_inputs)
    # the same kernels compute the values: equal to the bit
    assert torch.equal(features, ref_features) and torch.equal(tv, ref_tv)
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    up = (
        torch.randn(features.shape, generator=rng).to(device),
        torch.randn((), generator=rng).to(device),
    )
    torch.autograd.backward(tilted_plane_features_with_tv(*inputs), up)
    torch.autograd.backward(_apart(*apart_inputs), up)
    for name, x, r in zip(NAMES, inputs, apart_inputs):
        # the planes' gradient adds the same terms in another order
        assert_close(x.grad, r.grad, tol=1e-6, name=f"gradient of {name}")
    assert all(g is not None for g in folded)


@pytest.mark.parametrize("used", ["features", "tv"])
def test_one_output_alone_gives_that_output_gradient(rng, device, used):
    inputs = _inputs(rng, 25, 2, 3, 4, 5, device=device)
    refs = [x.detach().clone().requires_grad_() for x in inputs]
    pick = 0 if used == "features" else 1
    out = tilted_plane_features_with_tv(*inputs)[pick]
    ref = tilted_plane_features_with_tv_reference(*refs)[pick]
    up = torch.randn(out.shape, generator=rng, dtype=torch.float64).to(device)
    grads = torch.autograd.grad(out, inputs, up, allow_unused=True)
    ref_grads = torch.autograd.grad(ref, refs, up, allow_unused=True)
    for name, g, r in zip(NAMES, grads, ref_grads):
        if r is None:  # the plane TV does not depend on the points or rotations
            assert g is None or not g.abs().any(), name
        else:
            assert_close(g, r, name=f"gradient of {name}")


def test_only_the_planes_need_a_gradient(rng, device):
    points, rot, planes = _inputs(rng, 30, 2, 3, 4, 4, device=device)
    points.requires_grad_(False)
    rot.requires_grad_(False)
    assert_gradients_match(
        tilted_plane_features_with_tv, tilted_plane_features_with_tv_reference,
        [points, rot, planes], generator=rng, names=NAMES,
    )  # fmt: skip


def test_kernels_write_every_element_of_poisoned_buffers(monkeypatch, rng, device):
    # the plane TV's gradient buffer (empty_strided) is the features' accumulator: an element the
    # TV kernel skipped would stay NaN
    for name in ("empty", "empty_strided"):
        real = getattr(torch, name)

        def poisoned(*args, _real=real, **kwargs):
            t = _real(*args, **kwargs)
            return poison_(t) if t.is_floating_point() else t

        monkeypatch.setattr(torch, name, poisoned)
    inputs = _inputs(rng, 33, 2, 3, 4, 6, device=device)
    assert_gradients_match(
        tilted_plane_features_with_tv, tilted_plane_features_with_tv_reference, inputs,
        names=NAMES, generator=rng,
    )  # fmt: skip


def test_torch_backend_and_strided_planes_run_the_two_ops(rng, device):
    points, rot, planes = (x.detach() for x in _inputs(rng, 12, 1, 2, 6, 8, device=device))
    view = planes[:, :, ::2, ::2]  # a layout the kernels would copy first: taken apart
    for p, backend in ((planes, "torch"), (view, None)):
        out = tilted_plane_features_with_tv(points, rot, p, backend=backend)
        for o, r in zip(out, tilted_plane_features_with_tv_reference(points, rot, p)):
            assert_close(o, r)


def test_refuses_what_the_two_ops_refuse():
    points, rot = torch.zeros(4, 3), torch.eye(3).unsqueeze(0)
    with pytest.raises(ValueError, match="H, W >= 2"):
        tilted_plane_features_with_tv(points, rot, torch.zeros(3, 2, 1, 5))
    with pytest.raises(TypeError, match="float32 or float64"):
        tilted_plane_features_with_tv(points.half(), rot.half(), torch.zeros(3, 2, 4, 5).half())


def test_custom_op_registrations_pass_opcheck(rng, device):
    inputs = _inputs(rng, 12, 2, 3, 4, 5, device=device)
    torch.library.opcheck(
        torch.ops.tomo_kplanes.tilted_plane_features_with_tv.default,
        tuple(inputs),
        test_utils=(
            "test_schema",
            "test_autograd_registration",
            "test_faketensor",
            "test_aot_dispatch_static",
        ),
    )


def test_traces_under_torch_compile_fullgraph(rng, device):
    inputs = _inputs(rng, 20, 2, 3, 4, 5, device=device)
    refs = [x.detach().clone().requires_grad_() for x in inputs]

    def loss(fn, *x):
        features, tv = fn(*x)
        return features.square().sum() + 0.7 * tv

    compiled = torch.compile(
        lambda *x: loss(tilted_plane_features_with_tv, *x), fullgraph=True, backend="aot_eager"
    )
    out = compiled(*inputs)
    out.backward()
    ref = loss(tilted_plane_features_with_tv_reference, *refs)
    ref.backward()
    assert_close(out, ref)
    for name, x, r in zip(NAMES, inputs, refs):
        assert_close(x.grad, r.grad, name=f"gradient of {name}")


@pytest.mark.parametrize("scales", [(1.0,), (1.0, 0.5)])
def test_field_forward_with_plane_tv_equals_forward_and_plane_tv(rng, device, scales):
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,), generator=rng)))
    field = KPlanesTilted(
        6, channels=3, rotations=2, scales=scales, rotation_init_std=0.3, generator=g
    )
    field = field.to(device)
    points = (torch.rand(40, 3, generator=rng) * 2 - 1).to(device)
    up = torch.randn(40, generator=rng).to(device)
    grads = []
    for folded in (True, False):
        field.zero_grad(set_to_none=True)
        if folded:
            dens, tv = field(points, with_plane_tv=True)
        else:
            dens, tv = field(points), field.plane_tv()
        ((dens * up).sum() + 0.3 * tv).backward()
        grads.append({n: p.grad.clone() for n, p in field.named_parameters()})
        if folded:
            values = dens.detach(), tv.detach()
        else:
            assert torch.equal(values[0], dens) and torch.equal(values[1], tv)
    for name in grads[1]:
        assert_close(grads[0][name], grads[1][name], tol=1e-5, name=f"gradient of {name}")


def _loss_case(seed, device, backend=None):
    g = torch.Generator().manual_seed(seed)
    field = KPlanesTilted(
        8, channels=3, rotations=2, scales=(1.0, 0.5), rotation_init_std=0.2, backend=backend,
        generator=g,
    )  # fmt: skip
    obj = TomographyObject(field).to(device)
    geo = TiltGeometry(torch.tensor([-40.0, 10.0]), (6, 5))
    points, steps = geo.rays(torch.randperm(geo.num_rays, generator=g)[:10], 6)
    taps = obj.sample_tv_tap_coords(16, generator=g, device="cpu")
    target = torch.rand(10, generator=g)
    return obj, *(x.to(device) for x in (points, steps, target, taps))


def _step_grads(obj, points, steps, target, taps, weights):
    obj.zero_grad(set_to_none=True)
    ctx = ReconstructionContext(tv_tap_points=taps)
    loss, terms = reconstruction_loss(obj, points, steps, target, weights, ctx)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in obj.named_parameters()}
    return loss.detach(), {k: v.detach() for k, v in terms.items()}, grads


def test_training_loss_folded_and_unfolded_agree(monkeypatch, seed, device):
    obj, *batch = _loss_case(seed % 2**31, device)
    weights = LossWeights(volume_tv=0.1, plane_tv=0.05)
    folded = _step_grads(obj, *batch, weights)
    monkeypatch.setattr(KPlanesTilted, "plane_tv_from_forward", False)
    apart = _step_grads(obj, *batch, weights)
    assert torch.equal(folded[0], apart[0])  # the same kernels, the same values
    assert folded[1].keys() == apart[1].keys() == {"data", "volume_tv", "plane_tv"}
    for name in apart[1]:
        assert torch.equal(folded[1][name], apart[1][name]), name
    for name in apart[2]:
        assert_close(folded[2][name], apart[2][name], tol=1e-5, name=f"gradient of {name}")


@pytest.mark.parametrize(
    ("backend", "plane_weight"), [(None, 0.0), ("torch", 0.05)], ids=["no-plane-tv", "torch"]
)
def test_training_loss_does_not_fold_without_plane_tv_or_kernels(
    monkeypatch, seed, device, backend, plane_weight
):
    def refuse(*args, **kwargs):
        raise AssertionError("the fold ran")

    monkeypatch.setattr(model, "tilted_plane_features_with_tv", refuse)
    obj, *batch = _loss_case(seed % 2**31, device, backend)
    _, terms, grads = _step_grads(obj, *batch, LossWeights(volume_tv=0.1, plane_tv=plane_weight))
    assert ("plane_tv" in terms) == (plane_weight > 0)
    assert all(torch.isfinite(g).all() for g in grads.values())


@pytest.mark.gpu
def test_autotuning_trials_start_from_the_plane_tv_gradient(rng):
    # the features' backward tunes by running every config on the call's own buffers: each trial
    # must start from the plane TV's gradient, and so must the real run after them
    from tomo_kplanes.ops.tilted_plane_features.backward import _backward_kernel
    from triton_dispatch.launch import clear_plan_caches

    _backward_kernel.cache.clear()
    clear_plan_caches()
    inputs = _inputs(rng, 4096, 2, 16, 32, 32, dtype=torch.float32, device="cuda")
    assert_gradients_match(
        tilted_plane_features_with_tv, tilted_plane_features_with_tv_reference, inputs,
        tol=1e-5, grad_tol=1e-4, names=NAMES, generator=rng,
    )  # fmt: skip
