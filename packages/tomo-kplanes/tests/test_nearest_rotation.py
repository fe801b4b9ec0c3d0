import pytest
import torch

from tomo_kplanes.ops import nearest_rotation
from tomo_kplanes.ops.nearest_rotation import nearest_rotation_reference
from triton_dispatch import interpreter_enabled
from triton_dispatch.testing import assert_close, assert_gradients_match

# the kernel path: the interpreter on CPU, compiled on CUDA
KERNEL = "interpret" if interpreter_enabled() else None


def _matrices(rng, t, *, spread, reflect=(), device="cpu", dtype=torch.float64):
    m = torch.eye(3, dtype=torch.float64) + spread * torch.randn(t, 3, 3, generator=rng, dtype=torch.float64)
    for i in range(t):
        # redraw a nearly singular matrix (its nearest rotation is ill-posed) and, where a
        # reflection is asked for, one that is a reflection already
        while torch.linalg.svdvals(m[i]).min() < 0.1 or (i in reflect and torch.linalg.det(m[i]) < 0):
            m[i] = torch.eye(3, dtype=torch.float64) + spread * torch.randn(
                3, 3, generator=rng, dtype=torch.float64
            )
    for i in reflect:
        m[i, :, 0] = -m[i, :, 0]  # det < 0: the nearest rotation is not the polar factor
    return m.to(device=device, dtype=dtype)


@pytest.mark.parametrize(("t", "spread"), [(1, 0.02), (4, 0.3), (5, 1.0)])
def test_rotation_and_gradient_match_svd_in_float64(rng, device, t, spread):
    m = _matrices(rng, t, spread=spread, device=device).requires_grad_()
    assert_gradients_match(
        lambda x: nearest_rotation(x, backend=KERNEL), nearest_rotation_reference, [m],
        names=["matrices"], generator=rng,
    )


def test_reflections_map_to_the_nearest_rotation(rng, device):
    m = _matrices(rng, 4, spread=0.3, reflect=(1, 3), device=device).requires_grad_()
    assert (torch.linalg.det(m.detach().cpu())[[1, 3]] < 0).all()
    assert_gradients_match(
        lambda x: nearest_rotation(x, backend=KERNEL), nearest_rotation_reference, [m],
        names=["matrices"], generator=rng,
    )
    r = nearest_rotation(m.detach(), backend=KERNEL)
    assert_close(torch.linalg.det(r.cpu()), torch.ones(4, dtype=torch.float64))


def test_identity_start_has_a_finite_gradient(rng, device):
    eye = torch.eye(3, dtype=torch.float64, device=device).repeat(3, 1, 1).requires_grad_()
    r = nearest_rotation(eye, backend=KERNEL)
    assert_close(r, eye.detach())
    (r * torch.randn(3, 3, 3, generator=rng, dtype=torch.float64).to(device)).sum().backward()
    assert torch.isfinite(eye.grad).all()


def test_float32_matches_float64_reference(rng, device):
    m = _matrices(rng, 4, spread=0.1, dtype=torch.float32, device=device).requires_grad_()
    assert_gradients_match(
        lambda x: nearest_rotation(x, backend=KERNEL), nearest_rotation_reference, [m],
        tol=1e-5, grad_tol=1e-4, names=["matrices"], generator=rng,
    )


def test_batch_shape_and_empty_batch(device):
    m = torch.eye(3, device=device).repeat(2, 2, 1, 1)
    assert nearest_rotation(m, backend=KERNEL).shape == (2, 2, 3, 3)
    assert nearest_rotation(torch.empty(0, 3, 3, device=device), backend=KERNEL).shape == (0, 3, 3)


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (torch.zeros(2, 3, 4), ValueError, r"\(\.\.\., 3, 3\)"),
        (torch.zeros(3), ValueError, r"\(\.\.\., 3, 3\)"),
        (torch.zeros(2, 3, 3, dtype=torch.float16), TypeError, "float32 or float64"),
        (torch.zeros(2, 3, 3, dtype=torch.int64), TypeError, "float32 or float64"),
    ],
)
def test_bad_inputs_raise(value, error, match):
    for backend in (None, "torch"):
        with pytest.raises(error, match=match):
            nearest_rotation(value, backend=backend)


def test_custom_op_registrations_pass_opcheck(rng, device):
    m = _matrices(rng, 3, spread=0.2, device=device).requires_grad_()
    torch.library.opcheck(
        torch.ops.tomo_kplanes.nearest_rotation.default, (m,),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )


def test_degenerate_reflections_still_give_rotations(device):
    # repeated smallest singular values: the nearest rotation is not unique, but it must be one
    cases = torch.stack([
        torch.diag(torch.tensor([1.0, 1.0, -1.0])),
        -torch.eye(3),
        torch.diag(torch.tensor([2.0, -1.0, 1.0])),
    ]).double().to(device)
    r = nearest_rotation(cases, backend=KERNEL).cpu()
    assert_close(torch.linalg.det(r), torch.ones(3, dtype=torch.float64))
    assert_close(r @ r.transpose(-1, -2), torch.eye(3, dtype=torch.float64).expand(3, 3, 3))
    # same distance to the input as the SVD answer
    ref = nearest_rotation_reference(cases.cpu())
    assert_close((r - cases.cpu()).norm(dim=(1, 2)), (ref - cases.cpu()).norm(dim=(1, 2)))
