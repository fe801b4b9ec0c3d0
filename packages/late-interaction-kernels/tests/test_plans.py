"""The cached call path of ``maxsim``: a plan is reused only for calls whose metadata it was built
for, and every call, hit or miss, equals the float64 reference and the uncached path."""

from __future__ import annotations

import pytest
import torch

from late_interaction_kernels import maxsim
from late_interaction_kernels.ops.maxsim.dispatch import MAXSIM_PLANS
from late_interaction_kernels.ops.maxsim.reference import maxsim_reference
from triton_dispatch.testing import assert_close, rand_mask, randn


def _variants(rng):
    """(label, Q, D, q_mask, d_mask, expected to hit) in call order."""
    Q, D = randn((2, 3, 8), generator=rng), randn((3, 5, 8), generator=rng)
    qm, dm = rand_mask((2, 3), generator=rng), rand_mask((3, 5), generator=rng)
    yield "first", Q, D, qm, dm, False
    # new values, same metadata: the plan is reused and must not have kept any value
    yield "same metadata", randn((2, 3, 8), generator=rng), D * 2, qm, dm, True
    wide = randn((2, 3, 16), generator=rng)
    yield "non-contiguous Q", wide[..., ::2], D, qm, dm, False
    # the key holds contiguity, not strides: a stride-0 Q shares the non-contiguous plan, which
    # must therefore read strides per call
    yield "expanded Q", Q[:1].expand(2, -1, -1), D, qm, dm, True
    yield "expanded D", Q, D[:1].expand(3, -1, -1), qm, dm, False
    yield "float16", Q.half(), D.half(), qm, dm, False
    yield "another Nd", Q, D[:2], qm, dm[:2], False
    yield "no masks", Q, D, None, None, False
    yield "first again", Q, D, qm, dm, True


def test_plans_are_reused_only_for_their_metadata(rng, monkeypatch):
    MAXSIM_PLANS.clear()
    for label, Q, D, qm, dm, hit in _variants(rng):
        hits, misses = MAXSIM_PLANS.hits, MAXSIM_PLANS.misses
        got = maxsim(Q, D, qm, dm, normalize=False)
        assert (MAXSIM_PLANS.hits - hits, MAXSIM_PLANS.misses - misses) == (
            (1, 0) if hit else (0, 1)
        ), label
        want = maxsim_reference(Q.double(), D.double(), qm, dm)
        assert_close(got, want, dtype=Q.dtype, name=label)
        monkeypatch.setenv("TRITON_DISPATCH_PLAN_CACHE", "0")
        try:
            uncached = maxsim(Q, D, qm, dm, normalize=False)
        finally:
            monkeypatch.delenv("TRITON_DISPATCH_PLAN_CACHE")
        assert torch.equal(got, uncached), label


def test_training_calls_reuse_one_planned_autograd_node(rng):
    """A training call binds the forward and backward plans into one autograd node over the
    caller's tensors; a repeat call (new values, strided Q, an expanded output gradient) reuses
    the plan and still matches the float64 reference."""
    from triton_dispatch.testing import assert_gradients_match

    MAXSIM_PLANS.clear()
    wide = randn((2, 3, 16), generator=rng)
    for call, Q in enumerate([randn((2, 3, 8), generator=rng), wide[..., ::2], wide[..., 1::2]]):
        Q = Q.detach().requires_grad_()
        D = randn((2, 2, 5, 8), generator=rng, requires_grad=True)
        dm = rand_mask((2, 2, 5), generator=rng)
        out = maxsim(Q, D, None, dm)
        assert type(out.grad_fn).__name__ == "PlannedMaxSimBackward"
        out.sum().backward()  # the output gradient arrives expanded (stride 0)
        Qr, Dr = Q.detach().double().requires_grad_(), D.detach().double().requires_grad_()
        maxsim_reference(Qr, Dr, None, dm).sum().backward()
        assert_close(Q.grad, Qr.grad, dtype=torch.float32, name=f"grad Q, call {call}")
        assert_close(D.grad, Dr.grad, dtype=torch.float32, name=f"grad D, call {call}")
        Q.grad = D.grad = None
        assert_gradients_match(
            lambda q, d, m=dm: maxsim(q, d, None, m),
            lambda q, d, m=dm: maxsim_reference(q, d, None, m),
            [Q, D], generator=rng, names=["Q", "D"],
        )  # fmt: skip
    # contiguous Q, then two strided Qs sharing one plan (the key holds contiguity, not strides)
    assert MAXSIM_PLANS.misses == 2 and MAXSIM_PLANS.hits >= 2


@pytest.mark.parametrize("method", ["unified", "lowmem"])
@pytest.mark.parametrize(
    "layout, nq, nd, lq", [(0, 4, 6, 8), (2, 4, 4, 8), (0, 1, 3, 300), (0, 1, 40, 8)]
)
@pytest.mark.parametrize("normalize", [False, True])
def test_backward_compiled_ahead_takes_each_launchs_arguments(
    method, layout, nq, nd, lq, normalize
):
    # off the GPU nothing compiles, but every launch a backward kind would run is handed its
    # per-call arguments (a wrong count raises TypeError): dense, owner and atomic grad_D passes,
    # the split grad_Q and its finishing pass, the normalize passes
    from late_interaction_kernels.ops.maxsim.backward_plan import BackwardPlan
    from triton_dispatch.testing import recorded_compile_aheads

    pairs = nq * nd if layout == 0 else nq
    plan = BackwardPlan(
        layout, nq, nd, lq, nq * lq, pairs * 16 if layout else nd * 16, 32, torch.float16,
        torch.device("cpu"), method, True, True, normalize,
    )  # fmt: skip
    with recorded_compile_aheads() as calls:
        plan.compile_ahead()
    assert calls and all(len(free) == n for free, n in calls)
