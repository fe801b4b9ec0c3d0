import math

import pytest
import torch

from triton_dispatch.testing import (
    assert_close,
    assert_gradients_match,
    generator,
    lengths_mask,
    poison_,
    poisoned,
    rand_mask,
    randn,
    relative_error,
    seed_for,
    to_reference,
    tolerance,
)


def test_relative_error_is_norm_ratio():
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)
    out = torch.tensor([3.0, 4.5])
    assert math.isclose(relative_error(out, ref), 0.5 / 5.0)


def test_relative_error_zero_reference_is_absolute():
    assert relative_error(torch.zeros(3), torch.zeros(3)) == 0.0
    assert relative_error(torch.tensor([0.0, 1e-3]), torch.zeros(2)) == pytest.approx(1e-3)


def test_nan_and_inf_must_match_positions():
    ref = torch.tensor([1.0, float("nan"), float("inf")])
    assert relative_error(ref.clone(), ref) == 0.0
    assert relative_error(torch.tensor([1.0, 2.0, float("inf")]), ref) == math.inf
    assert relative_error(torch.tensor([1.0, float("nan"), -float("inf")]), ref) == math.inf


def test_assert_close_fails_with_a_useful_message():
    ref = torch.ones(10, dtype=torch.float64)
    with pytest.raises(AssertionError, match=r"grad_Q: relative error .* exceeds 1.0e-05"):
        assert_close(torch.ones(10) * 1.001, ref, name="grad_Q")
    assert assert_close(torch.ones(10, dtype=torch.bfloat16), ref) == 0.0
    with pytest.raises(AssertionError, match="shape mismatch"):
        assert_close(torch.ones(3), torch.ones(4))


def test_poisoned_output_is_never_close():
    ref = torch.ones(4, dtype=torch.float64)
    with pytest.raises(AssertionError):
        assert_close(poisoned((4,)), ref)
    ints = poison_(torch.zeros(3, dtype=torch.int32))
    assert (ints == torch.iinfo(torch.int32).min).all()
    with pytest.raises(TypeError):
        poison_(torch.zeros(2, dtype=torch.bool))


def test_tolerances_order_by_precision():
    assert (
        tolerance(torch.float64)
        < tolerance(torch.float32)
        < tolerance(torch.float16)
        < tolerance(torch.bfloat16)
    )
    with pytest.raises(TypeError):
        tolerance(torch.int8)


def test_to_reference_upcasts_and_keeps_requires_grad():
    a = torch.ones(2, dtype=torch.float16, requires_grad=True)
    b = torch.ones(2, dtype=torch.int64)
    ra, rb, rn = to_reference(a, b, None)
    assert ra.dtype == torch.float64 and ra.requires_grad and ra.is_leaf
    assert rb.dtype == torch.int64 and rn is None


def _softmax_dot(x, w):
    return (torch.softmax(x, -1) * w).sum(-1)


class _WrongGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.square()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x  # should be 2·g·x


def test_gradient_parity_passes_for_a_correct_op(rng):
    x = randn((5, 7), generator=rng, requires_grad=True)
    w = randn((5, 7), generator=rng, requires_grad=True)
    errors = assert_gradients_match(
        _softmax_dot, _softmax_dot, [x, w], names=["x", "w"], generator=rng
    )
    assert set(errors) == {"out0", "grad_x", "grad_w"}
    assert all(e < 1e-6 for e in errors.values())


def test_gradient_parity_catches_a_wrong_backward(rng):
    x = randn((6,), generator=rng, requires_grad=True)
    with pytest.raises(AssertionError, match="gradient of x"):
        assert_gradients_match(_WrongGradient.apply, torch.square, [x], names=["x"], generator=rng)


def test_gradient_parity_catches_a_missing_gradient(rng):
    x = randn((3,), generator=rng, requires_grad=True)
    y = randn((3,), generator=rng, requires_grad=True)
    with pytest.raises(AssertionError, match="no gradient"):
        assert_gradients_match(
            lambda a, b: a * b.detach(), lambda a, b: a * b, [x, y], names=["x", "y"]
        )


def test_seeds_are_stable_and_distinct():
    assert seed_for(1, "a") == seed_for(1, "a") != seed_for(1, "b")
    a = randn((4,), generator=generator(7))
    b = randn((4,), generator=generator(7))
    assert torch.equal(a, b)


def test_seed_fixture_is_fresh_per_test(seed, rng):
    assert isinstance(seed, int) and isinstance(rng, torch.Generator)


def test_masks():
    m = rand_mask((1000,), p_valid=0.25, generator=generator(0))
    assert m.dtype == torch.bool and 150 < int(m.sum()) < 350
    assert lengths_mask([0, 2, 3], 3).tolist() == [[False] * 3, [True, True, False], [True] * 3]
