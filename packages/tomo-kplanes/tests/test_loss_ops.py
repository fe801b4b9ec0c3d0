"""The fused loss ops (``ray_loss``, ``plane_tv``) against their float64 references."""

import pytest
import torch

from tomo_kplanes.ops import plane_tv, ray_loss
from tomo_kplanes.ops.plane_tv import plane_tv_reference
from tomo_kplanes.ops.ray_loss import ray_loss_reference
from triton_dispatch.testing import assert_close, assert_gradients_match, poison_

NAMES = ["densities", "points", "steps", "target", "plane_tv"]


def _ray_inputs(rng, b, s, m, *, dtype=torch.float64, device="cpu", plane=True):
    f64 = torch.float64
    # a fifth of the samples outside the box, so the mask has work to do
    points = torch.rand(b, s, 3, generator=rng, dtype=f64) * 2.5 - 1.25
    densities = torch.randn(b * s + 4 * m, generator=rng, dtype=f64)
    steps = torch.rand(b, generator=rng, dtype=f64) * 0.1
    target = torch.rand(b, generator=rng, dtype=f64)
    tensors = [densities, points, steps, target]
    if plane:
        tensors.append(torch.rand((), generator=rng, dtype=f64))
    out = [t.to(device=device, dtype=dtype) for t in tensors]
    out[0].requires_grad_()
    if plane:
        out[4].requires_grad_()
    else:
        out.append(None)
    return out


def _settings(positivity=True, shrinkage=0.0, mask=True):
    return dict(
        tv_step=0.125, volume_tv_weight=0.3, plane_tv_weight=0.02, positivity=positivity,
        shrinkage=shrinkage, mask_out_of_bounds=mask,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("b", "s", "m", "constraints"),
    [
        (6, 7, 9, {}),
        (3, 300, 0, {"shrinkage": 0.3}),
        (1, 1, 1, {"positivity": False, "mask": False}),
        (9, 5, 70, {"shrinkage": 0.5, "positivity": False}),
    ],
)
@pytest.mark.parametrize("plane", [True, False], ids=["plane-tv", "no-plane-tv"])
def test_ray_loss_matches_the_reference_in_float64(rng, device, b, s, m, constraints, plane):
    inputs = _ray_inputs(rng, b, s, m, device=device, plane=plane)
    settings = _settings(**constraints)
    errors = assert_gradients_match(
        lambda *x: ray_loss(*x, **settings),
        lambda *x: ray_loss_reference(*x, **settings),
        inputs,
        generator=rng,
        names=NAMES,
    )
    # both outputs are differentiated (random upstream gradients on the total and the terms)
    assert {"out0", "out1", "grad_densities"} <= set(errors)
    assert ("grad_plane_tv" in errors) == plane


def test_ray_loss_float32_matches_the_float64_reference(rng, device):
    inputs = _ray_inputs(rng, 16, 40, 50, dtype=torch.float32, device=device)
    settings = _settings(shrinkage=0.1)
    assert_gradients_match(
        lambda *x: ray_loss(*x, **settings),
        lambda *x: ray_loss_reference(*x, **settings),
        inputs,
        tol=1e-5,
        grad_tol=1e-5,
        generator=rng,
        names=NAMES,
    )


def test_ray_loss_terms_add_up_to_the_total_and_only_total_needs_a_gradient(rng, device):
    densities, points, steps, target, ptv = _ray_inputs(rng, 4, 6, 8, device=device)
    total, terms = ray_loss(densities, points, steps, target, ptv, **_settings())
    assert torch.equal(total, terms[0] + terms[1] + terms[2])
    total.backward()  # the terms' gradient is never made up
    ref = [t.detach().clone().requires_grad_(t.requires_grad) for t in (densities, ptv)]
    ref_total, _ = ray_loss_reference(ref[0], points, steps, target, ref[1], **_settings())
    ref_total.backward()
    assert_close(densities.grad, ref[0].grad)
    assert_close(ptv.grad, ref[1].grad)


def _poisoned_empty(monkeypatch):
    real_empty = torch.empty

    def poisoned(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return poison_(t) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)


def test_ray_loss_kernels_write_every_element_of_poisoned_buffers(monkeypatch, rng, device):
    _poisoned_empty(monkeypatch)
    inputs = _ray_inputs(rng, 5, 9, 13, device=device)
    settings = _settings(shrinkage=0.2)
    assert_gradients_match(
        lambda *x: ray_loss(*x, **settings),
        lambda *x: ray_loss_reference(*x, **settings),
        inputs,
        generator=rng,
        names=NAMES,
    )


def test_ray_loss_custom_op_registrations_pass_opcheck(rng, device):
    densities, points, steps, target, ptv = _ray_inputs(rng, 3, 4, 5, device=device)
    torch.library.opcheck(
        torch.ops.tomo_kplanes.ray_loss.default,
        (densities, points, steps, target, ptv),
        _settings(shrinkage=0.1),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )


def test_ray_loss_and_plane_tv_trace_under_torch_compile_fullgraph(rng, device):
    densities, points, steps, target, _ = _ray_inputs(rng, 3, 5, 4, device=device, plane=False)
    planes = torch.randn(6, 2, 4, 5, generator=rng, dtype=torch.float64).to(device)
    planes.requires_grad_()
    settings = _settings()

    def loss(densities, planes):
        return ray_loss(densities, points, steps, target, plane_tv(planes), **settings)[0]

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    out = compiled(densities, planes)
    out.backward()
    ref_d, ref_p = (x.detach().clone().requires_grad_() for x in (densities, planes))
    ref = ray_loss_reference(ref_d, points, steps, target, plane_tv_reference(ref_p), **settings)[0]
    ref.backward()
    assert_close(out, ref)
    assert_close(densities.grad, ref_d.grad)
    assert_close(planes.grad, ref_p.grad)


@pytest.mark.parametrize(
    ("shape", "channels_last"),
    [((6, 3, 5, 7), False), ((6, 3, 5, 7), True), ((2, 2), False), ((3, 40, 33), False)],
)
def test_plane_tv_matches_the_reference_in_float64(rng, device, shape, channels_last):
    planes = torch.randn(shape, generator=rng, dtype=torch.float64).to(device)
    if channels_last:
        planes = planes.contiguous(memory_format=torch.channels_last)
    planes.requires_grad_()
    assert_gradients_match(plane_tv, plane_tv_reference, [planes], generator=rng, names=["planes"])
    # the gradient keeps the parameter's layout, so accumulating it never copies
    assert planes.grad.stride() == planes.stride()


def test_plane_tv_float32_channels_last_matches_the_float64_reference(rng, device):
    planes = torch.rand(12, 8, 20, 20, generator=rng).to(device)
    planes = planes.contiguous(memory_format=torch.channels_last).requires_grad_()
    assert_gradients_match(
        plane_tv, plane_tv_reference, [planes], tol=1e-5, grad_tol=1e-5, generator=rng,
        names=["planes"],
    )  # fmt: skip


def test_plane_tv_kernels_write_every_element_of_poisoned_buffers(monkeypatch, rng, device):
    _poisoned_empty(monkeypatch)
    planes = torch.randn(3, 2, 6, 5, generator=rng, dtype=torch.float64).to(device)
    planes = planes.contiguous(memory_format=torch.channels_last).requires_grad_()
    assert_gradients_match(plane_tv, plane_tv_reference, [planes], generator=rng, names=["planes"])


def test_plane_tv_custom_op_registrations_pass_opcheck(rng, device):
    planes = torch.randn(3, 2, 4, 5, generator=rng, dtype=torch.float64).to(device)
    torch.library.opcheck(
        torch.ops.tomo_kplanes.plane_tv.default,
        (planes.requires_grad_(),),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )


def test_plane_tv_of_a_strided_view_is_not_taken_for_a_dense_layout(rng, device):
    # same shape and dtype as a dense call made first: the cached plan must not be reused blindly
    base = torch.randn(4, 3, 10, 12, generator=rng, dtype=torch.float64).to(device)
    dense = base[:, :, :5, :6].contiguous()
    view = base[:, :, ::2, ::2]
    for planes in (dense, view):
        assert_close(plane_tv(planes), plane_tv_reference(planes))
