"""The cached call paths of ``quantize`` and ``ema_update_``: a plan is reused only for calls whose
metadata it was built for, and every call, hit or miss, equals the float64 reference and the
uncached path."""

from __future__ import annotations

import torch
from vq_test_helpers import assert_state_matches, make_state, reference_step

from triton_dispatch.testing import randint, randn
from vq_kernels import ema_update_, quantize
from vq_kernels.ops.ema_update.op import EMA_UPDATE
from vq_kernels.ops.quantize.op import NEAREST_CODE
from vq_kernels.ops.quantize.reference import distances_reference

QUANTIZE_PLANS = NEAREST_CODE.plans
UPDATE_PLANS = EMA_UPDATE.plans


def _counts(cache):
    return cache.hits, cache.misses


def _expect(cache, before, hit, label):
    delta = (cache.hits - before[0], cache.misses - before[1])
    assert delta == ((1, 0) if hit else (0, 1)), (label, delta)


def _uncached(monkeypatch, fn):
    monkeypatch.setenv("TRITON_DISPATCH_PLAN_CACHE", "0")
    try:
        return fn()
    finally:
        monkeypatch.delenv("TRITON_DISPATCH_PLAN_CACHE")


def test_quantize_plans_follow_metadata(rng, monkeypatch):
    QUANTIZE_PLANS.clear()
    x, cb = randn((6, 8), generator=rng), randn((5, 8), generator=rng)
    wide = randn((6, 16), generator=rng)
    variants = [
        ("first", x, cb, False),
        ("same metadata", randn((6, 8), generator=rng), cb * 3, True),
        ("non-contiguous x", wide[:, ::2], cb, False),
        # the key holds contiguity, not strides: the non-contiguous plan serves this stride-0 view
        # too, so it must read strides per call (the result checks prove it does)
        ("expanded x", x[:1].expand(6, -1), cb, True),
        ("float16", x.half(), cb.half(), False),
        ("another K", x, cb[:3], False),
        ("first again", x, cb, True),
    ]
    for label, xi, cbi, hit in variants:
        before = _counts(QUANTIZE_PLANS)
        codes, quantized = quantize(xi, cbi)
        _expect(QUANTIZE_PLANS, before, hit, label)
        # the chosen code is a nearest one (ties may go either way under rounding)
        d = distances_reference(xi.double(), cbi.double(), "l2")
        chosen = d.gather(1, codes[:, None])[:, 0]
        torch.testing.assert_close(chosen, d.min(1).values, rtol=1e-3, atol=1e-3, msg=label)
        assert torch.equal(quantized, cbi[codes]), label
        again = _uncached(monkeypatch, lambda: quantize(xi, cbi))  # noqa: B023
        assert torch.equal(codes, again[0]), label


def test_ema_update_plans_follow_metadata(rng, monkeypatch):
    UPDATE_PLANS.clear()
    levels, k, dim, batch = 2, 6, 4, 9

    def call(label, x, codes, hit):
        state = list(make_state(levels, k, dim, rng=rng))
        candidates = torch.zeros(levels, k, dtype=torch.int64)
        ref, ref_replaced = reference_step(
            x, codes, state, candidates, decay=0.9, semantics="active_only", threshold=None
        )
        copies = [t.clone() for t in state]
        before = _counts(UPDATE_PLANS)
        replaced = ema_update_(x, codes, *state, decay=0.9, dead_threshold=None)
        _expect(UPDATE_PLANS, before, hit, label)
        assert_state_matches(state, ref, replaced, ref_replaced)
        _uncached(
            monkeypatch,
            lambda: ema_update_(x, codes, *copies, decay=0.9, dead_threshold=None),
        )
        for a, b in zip(state, copies):
            assert torch.equal(a, b), label

    x = randn((levels, batch, dim), generator=rng)
    codes = randint(0, k, (levels, batch), generator=rng)
    call("first", x, codes, False)
    call("same metadata", randn((levels, batch, dim), generator=rng), codes.flip(1), True)
    call("non-contiguous x", randn((levels, batch, 2 * dim), generator=rng)[..., ::2], codes, False)
    # same key as the non-contiguous call (contiguity, not strides): one plan, both stride patterns
    call("expanded x", x[:, :1].expand(-1, batch, -1), codes, True)
    call("another batch", x[:, :5], codes[:, :5], False)
    call("first again", x, codes, True)


def test_update_compiled_ahead_takes_the_launch_arguments(rng):
    # off the GPU nothing compiles, but the launch is built and its per-call arguments counted
    # (a wrong count raises TypeError), for the small-batch and the cooperative kernel
    from triton_dispatch.testing import recorded_compile_aheads
    from vq_kernels.ops.ema_update.kernels import compile_update_ahead, small_update_fits

    levels, codes, dim = 2, 16, 8
    codebook, size, embed_sum, counter = make_state(levels, codes, dim, rng=rng)
    with recorded_compile_aheads() as counted:
        for batch in (8, 1 << 20):
            assert small_update_fits(batch, codes, dim) == (batch == 8)
            compile_update_ahead(
                torch.float32, batch, codebook, size, embed_sum, counter, 0.99, 1e-5, 1.0,
            )  # fmt: skip
    assert [n for _, n in counted] == [len(free) for free, _ in counted] and len(counted) == 2
