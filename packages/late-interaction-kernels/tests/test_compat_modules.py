"""Behaviour of the 0.4.5-compatible modules built on our ops: the scoring module, the fused head
with the ``nn.Linear`` weight convention, the reference module's 2-D inputs, the callers' entry
points."""

from __future__ import annotations

import pytest
import torch

from late_interaction_kernels import MaxSimScorer, autograd, mps, reference
from late_interaction_kernels.fused_head import maxsim_from_hidden
from triton_dispatch.testing import assert_close, assert_gradients_match

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")


def test_scorer_module(rng):
    Q = torch.randn(2, 3, 8, generator=rng, requires_grad=True)
    D = torch.randn(4, 5, 8, generator=rng, requires_grad=True)
    scorer = MaxSimScorer(mask_pad_token=0)
    assert list(scorer.parameters()) == [] and "normalize=True" in repr(scorer)
    assert_gradients_match(
        scorer, lambda q, d: reference.maxsim_reference(q, d, normalize=True), [Q, D],
        generator=rng, names=["Q", "D"],
    )  # fmt: skip
    assert not scorer.score(Q, D).requires_grad
    q_ids = torch.tensor([[5, 6, 0], [7, 0, 0]])
    d_ids = torch.randint(1, 9, (4, 5), generator=rng)
    d_ids[:, -1] = 0
    got = scorer.forward_with_ids(Q, D, q_ids, d_ids)
    want = reference.maxsim_reference(Q.double(), D.double(), q_ids != 0, d_ids != 0, normalize=True)
    assert_close(got, want)
    scores, idx = scorer.retrieve(Q, D, 2)
    assert_close(scores, want.new_tensor(0) + reference.maxsim_reference(
        Q.double(), D.double(), normalize=True).topk(2, dim=1).values)  # fmt: skip
    assert idx.shape == (2, 2)


@pytest.mark.parametrize("normalize", [True, False])
def test_fused_head_takes_linear_weight(normalize, rng):
    Q = torch.randn(3, 4, generator=rng, requires_grad=True)  # one 2-D query, d_out = 4
    H = torch.randn(2, 5, 6, generator=rng, requires_grad=True)
    W = torch.randn(4, 6, generator=rng, requires_grad=True)  # (d_out, d_model)
    b = torch.randn(4, generator=rng, requires_grad=True)
    mask = torch.rand(2, 5, generator=rng) > 0.3
    assert_gradients_match(
        lambda q, h, w, bb: maxsim_from_hidden(q, h, w, bb, mask, normalize),
        lambda q, h, w, bb: reference.maxsim_from_hidden_reference(q, h, w, bb, mask,
                                                                   normalize=normalize),
        [Q, H, W, b], generator=rng, names=["Q", "H_d", "W", "b"],
        # b's gradient is a sum of signed terms that cancel: fp32 rounding is relative to the
        # terms, so the sum's relative error can pass 1e-5 on some draws
        grad_tol=1e-4,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"W must be \[d_out=4, d_model=6\]"):
        maxsim_from_hidden(Q, H, W.t(), b)


def test_reference_squeezes_2d_inputs(rng):
    Q = torch.randn(3, 8, generator=rng)
    D = torch.randn(4, 5, 8, generator=rng)
    assert reference.maxsim_reference(Q, D).shape == (4,)
    assert reference.maxsim_reference(Q, D[0]).shape == ()
    with pytest.raises(ValueError, match="embedding dims"):
        reference.maxsim_reference(Q, D[..., :4])


def test_callers_entry_points_keep_their_mask_rule(rng):
    Q = torch.nn.functional.normalize(torch.randn(2, 3, 8, generator=rng), dim=-1)
    D = torch.nn.functional.normalize(torch.randn(2, 5, 8, generator=rng), dim=-1)
    d_mask = torch.rand(2, 5, generator=rng) > 0.4
    zeroed = D * d_mask[..., None]
    want = torch.einsum("qid,qjd->qij", Q.double(), zeroed.double()).amax(-1).sum(-1)
    assert_close(autograd.maxsim_pairs(Q, D, d_mask=d_mask), want)
    assert_close(autograd.maxsim(Q, D, d_mask=d_mask).diagonal(), want)
    assert_close(mps.maxsim_inference_mps(Q * 3, D, normalize=True),
                 autograd.maxsim(Q, D))  # fmt: skip


def test_callers_entry_point_takes_one_query(rng):
    """``autograd.maxsim(Q (Lq, d), D)``: scores ``(Nd,)``, a gradient shaped like Q."""
    Q = torch.randn(3, 8, generator=rng, requires_grad=True)
    D = torch.randn(4, 5, 8, generator=rng, requires_grad=True)
    assert_gradients_match(
        autograd.maxsim, lambda q, d: reference.maxsim_reference(q, d), [Q, D], generator=rng
    )
    assert Q.grad.shape == (3, 8)
