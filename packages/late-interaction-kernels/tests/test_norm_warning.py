"""``maxsim(..., normalize=False)`` warns once per process when the queries are not unit vectors,
as late-interaction-kernels 0.4.5 does (same condition, tolerance, message, category and switch),
without a host read on a warm call."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import late_interaction_kernels as lik
from late_interaction_kernels import autograd
from late_interaction_kernels.ops.maxsim import dispatch as maxsim_ops
from late_interaction_kernels.ops.maxsim.norm_check import ENV_VAR, NORM_CHECK
from late_interaction_kernels.topk import maxsim_topk
from late_interaction_kernels.warmup import warmup

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)


@pytest.fixture(autouse=True)
def armed(monkeypatch):
    """A process that has not checked yet, with the switch unset."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(NORM_CHECK, "pending", True)


def _unit(rng, *shape):
    return F.normalize(torch.randn(*shape, generator=rng), dim=-1)


def _silent(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        return fn(*args, **kwargs)


def test_warns_once_naming_the_caller(rng):
    Q, D = 3 * _unit(rng, 2, 5, 8), _unit(rng, 4, 6, 8)
    with pytest.warns(UserWarning, match=r"median L2 norm is 3\.000 .*LIK_SUPPRESS_NORM_WARN=1"):
        lik.maxsim(Q, D)
    with pytest.warns(UserWarning) as record:
        NORM_CHECK.reset()
        lik.maxsim(Q, D)
    (warning,) = [w for w in record if w.category is UserWarning]
    assert warning.filename == __file__
    assert not NORM_CHECK.pending
    _silent(lik.maxsim, Q, D)  # once per process: neither a repeat call
    _silent(lik.maxsim, 5 * _unit(rng, 3, 7, 8), D)  # nor a new kind of call


@pytest.mark.parametrize(
    ("scale", "warns"), [(0.92, False), (1.08, False), (0.85, True), (1.2, True)]
)
def test_tolerance_is_the_median_norm_within_0_9_and_1_1(rng, scale, warns):
    Q, D = scale * _unit(rng, 2, 5, 8), _unit(rng, 4, 6, 8)
    if warns:
        with pytest.warns(UserWarning, match="normalize=False"):
            lik.maxsim(Q, D)
    else:
        _silent(lik.maxsim, Q, D)
    assert not NORM_CHECK.pending


def test_normalised_queries_do_not_warn_and_only_the_first_call_is_checked(rng):
    Q, D = _unit(rng, 2, 5, 8), _unit(rng, 4, 6, 8)
    _silent(lik.maxsim, Q, D)
    assert not NORM_CHECK.pending
    _silent(lik.maxsim, 4 * Q, D)  # 0.4.5 looks at the first eligible call only


def test_the_sample_is_the_first_64_tokens_masks_ignored(rng):
    Q = _unit(rng, 2, 40, 8)
    Q[1, 24:] *= 100  # tokens 64..79 of the flattened queries
    _silent(lik.maxsim, Q, _unit(rng, 3, 6, 8), torch.ones(2, 40, dtype=torch.bool))


def test_normalize_true_4d_documents_and_pairs_are_not_checked(rng):
    Q = 3 * _unit(rng, 2, 5, 8)
    _silent(lik.maxsim, Q, _unit(rng, 4, 6, 8), normalize=True)
    _silent(lik.maxsim, Q, _unit(rng, 2, 3, 6, 8))  # (Nq, K, Ld, d)
    _silent(lik.maxsim_pairs, Q, _unit(rng, 2, 6, 8))
    assert NORM_CHECK.pending  # left for a later eligible call
    with pytest.warns(UserWarning, match="normalize=False"):
        lik.maxsim(Q, _unit(rng, 4, 6, 8))


def test_the_switch_silences_it(rng, monkeypatch):
    Q, D = 3 * _unit(rng, 2, 5, 8), _unit(rng, 4, 6, 8)
    monkeypatch.setenv(ENV_VAR, "1")
    _silent(lik.maxsim, Q, D)
    _silent(lik.MaxSimScorer(normalize=False), Q, D)
    assert NORM_CHECK.pending  # a call made while it is set leaves the check pending (0.4.5)
    monkeypatch.setenv(ENV_VAR, "0")
    with pytest.warns(UserWarning, match="normalize=False"):
        lik.maxsim(Q, D)


@pytest.mark.parametrize(
    "call",
    [
        lambda Q, D: autograd.maxsim(Q, D),
        lambda Q, D: lik.MaxSimScorer(normalize=False)(Q, D),
    ],
    ids=["autograd.maxsim", "MaxSimScorer"],
)
def test_what_0_4_5_checked_through_maxsim_warns_too(rng, call):
    Q, D = 3 * _unit(rng, 2, 5, 8), _unit(rng, 4, 6, 8)
    with pytest.warns(UserWarning, match="median L2 norm is 3.000") as record:
        call(Q, D)
    (warning,) = [w for w in record if w.category is UserWarning]
    assert warning.filename == __file__


def test_ops_built_on_maxsim_and_the_warm_up_do_not_check(rng):
    Q, D = 3 * _unit(rng, 2, 5, 8), _unit(rng, 4, 6, 8)
    _silent(maxsim_topk, Q, D, 2, normalize=False)
    _silent(lik.retrieve, Q, D, 2, normalize=False)
    cu_q = torch.tensor([0, 2, 5])
    cu_d = torch.tensor([0, 4, 6])
    _silent(lik.maxsim_varlen, Q.reshape(-1, 8)[:5], D.reshape(-1, 8)[:6], cu_q, cu_d)
    _silent(warmup, ["2x3x4x5x8"], device="cpu", dtype=torch.float32, backward=False)
    assert NORM_CHECK.pending


def test_device_tensors_are_checked_only_on_a_call_that_builds_its_plan(rng, monkeypatch):
    """A warm call must stay one launch with no host read; a plan build may read (CPU tensors
    synchronise with nothing, so they are checked on any call)."""
    seen = []

    class Spy:
        pending = True

        def __call__(self, Q, D, *, building_plan):
            seen.append(building_plan)

    monkeypatch.setattr(maxsim_ops, "NORM_CHECK", Spy())
    Q, D = _unit(rng, 2, 5, 8), _unit(rng, 4, 6, 8)
    lik.maxsim(Q, D)
    lik.maxsim(Q, D)
    assert seen == [True, False]
    meta_q, meta_d = torch.empty(2, 5, 8, device="meta"), torch.empty(4, 6, 8, device="meta")
    NORM_CHECK(meta_q, meta_d, building_plan=False)  # would need a host read: not now
    assert NORM_CHECK.pending


def test_once_checked_a_call_pays_one_attribute_test(rng, monkeypatch):
    Q, D = _unit(rng, 2, 5, 8), _unit(rng, 4, 6, 8)
    lik.maxsim(Q, D)
    assert not NORM_CHECK.pending

    def fail(*args, **kwargs):
        raise AssertionError("the checking path ran after the check")

    monkeypatch.setattr(maxsim_ops, "_maxsim_checking_norms", fail)
    hits = maxsim_ops.MAXSIM_PLANS.hits
    lik.maxsim(Q, D)
    assert maxsim_ops.MAXSIM_PLANS.hits == hits + 1
