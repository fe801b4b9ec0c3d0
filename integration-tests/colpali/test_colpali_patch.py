"""The real colpali-engine losses and scorer, patched against unpatched, on CPU through the
Triton interpreter: same losses, same gradients, padding on either side, hard negatives."""

from __future__ import annotations

import logging
from importlib.metadata import version

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip(
    "colpali_engine", reason="needs the 'colpali' extra of late-interaction-kernels"
)

from colpali_engine.loss import late_interaction_losses as losses
from colpali_engine.utils import processing_utils

from late_interaction_kernels.integrations import (
    UnsupportedVersionError,
    _patching,
    patch_colpali_engine,
    unpatch_colpali_engine,
)
from late_interaction_kernels.integrations import colpali as colpali_patch
from triton_dispatch.testing import assert_close


def padded_embeddings(
    rng: torch.Generator, *shape_and_len: int, lengths: list[int], left: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """A leaf ``raw`` of shape ``(*batch, L, d)`` and the embeddings made from it the way the
    models do (normalise, then multiply by the attention mask), padded right or left."""
    *batch, length, dim = shape_and_len
    raw = torch.randn(*batch, length, dim, generator=rng).requires_grad_(True)
    flat_lengths = torch.tensor(lengths).reshape(*batch, 1)
    positions = torch.arange(length)
    valid = positions >= length - flat_lengths if left else positions < flat_lengths
    emb = F.normalize(raw, dim=-1) * valid.unsqueeze(-1)
    return raw, emb


def grads(loss: torch.Tensor, *leaves: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, leaves, retain_graph=True))


B, LQ, LD, DIM, NNEG = 3, 5, 7, 16, 2
IN_BATCH = [
    name
    for name in ("ColbertLoss", "ColbertPairwiseCELoss", "ColbertSigmoidLoss")
    if hasattr(losses, name)  # the sigmoid loss arrived in 0.3.13
]
WITH_NEGATIVES = ["ColbertNegativeCELoss", "ColbertPairwiseNegativeCELoss"]
# before 0.3.13 the negative losses took one negative per query, (B, Ld, d), and no offset
ONE_NEGATIVE = _patching._release(version("colpali-engine")) < (0, 3, 13)


@pytest.fixture(autouse=True)
def _unpatched():
    unpatch_colpali_engine()
    yield
    unpatch_colpali_engine()


def batch(rng, *, left: bool = False, gathered: int = 1):
    q_raw, q = padded_embeddings(rng, B, LQ, DIM, lengths=[5, 3, 4])
    d_lengths = [7, 4, 6, 2, 5, 7][: B * gathered]
    d_raw, d = padded_embeddings(rng, B * gathered, LD, DIM, lengths=d_lengths, left=left)
    if ONE_NEGATIVE:
        n_raw, n = padded_embeddings(rng, B, LD, DIM, lengths=[7, 3, 5], left=left)
    else:
        n_raw, n = padded_embeddings(rng, B, NNEG, LD, DIM, lengths=[7, 3, 5, 6, 1, 4], left=left)
    return (q_raw, q), (d_raw, d), (n_raw, n)


def run_loss(loss, q, d, n, offset, leaves):
    value = loss(q, d, n, offset=offset) if n is not None else loss(q, d, offset=offset)
    return value.detach(), grads(value, *leaves)


def compare(name, rng, calls, *, left=False, gathered=1, expect_kernel=True, **options):
    (q_raw, q), (d_raw, d), (n_raw, n) = batch(rng, left=left, gathered=gathered)
    offset = B * (gathered - 1)
    loss = getattr(losses, name)(**options)
    with_neg = name in WITH_NEGATIVES
    leaves = (q_raw, d_raw, n_raw) if with_neg else (q_raw, d_raw)
    negatives = n if with_neg else None
    want, want_grads = run_loss(loss, q, d, negatives, offset, leaves)

    assert patch_colpali_engine()
    got, got_grads = run_loss(loss, q, d, negatives, offset, leaves)
    assert_close(got, want.double(), tol=1e-5, name=f"{name} loss")
    for label, g, w in zip(("query", "doc", "negatives"), got_grads, want_grads):
        assert_close(g, w.double(), tol=1e-4, name=f"{name} d/d{label}")
    if expect_kernel:
        assert calls["n"] > 0, "the patched loss never reached the fused kernels"
    return calls


@pytest.mark.parametrize("name", IN_BATCH + WITH_NEGATIVES)
@pytest.mark.parametrize("normalize_scores", [True, False])
def test_loss_matches_unpatched(name, normalize_scores, rng, kernel_calls):
    # on versions with their own backend only the negative losses' positive term is ours
    expect = name in WITH_NEGATIVES or not colpali_patch.has_native_backend()
    compare(name, rng, kernel_calls, normalize_scores=normalize_scores, expect_kernel=expect)


@pytest.mark.parametrize("name", ["ColbertLoss", *WITH_NEGATIVES])
def test_left_padded_gathered_documents_with_offset(name, rng, kernel_calls):
    if ONE_NEGATIVE and name in WITH_NEGATIVES:
        pytest.skip("this colpali-engine's negative losses do not support gathered documents")
    expect = name in WITH_NEGATIVES or not colpali_patch.has_native_backend()
    compare(name, rng, kernel_calls, left=True, gathered=2, expect_kernel=expect)


def test_pos_aware_filtering_and_in_batch_term(rng, kernel_calls):
    compare(
        "ColbertNegativeCELoss",
        rng,
        kernel_calls,
        pos_aware_negative_filtering=True,
        in_batch_term_weight=0.3,
    )


@pytest.mark.parametrize("name", ["ColbertLoss", *WITH_NEGATIVES])
def test_smooth_max_falls_through_unchanged(name, rng, kernel_calls):
    compare(name, rng, kernel_calls, use_smooth_max=True, expect_kernel=False)
    assert kernel_calls["n"] == 0


def test_unsupported_device_falls_through_unchanged(rng, monkeypatch, kernel_calls):
    # the reference backend stands for a device the kernels do not run on (MPS, plain CPU)
    monkeypatch.setenv("TRITON_DISPATCH_BACKEND", "torch")
    compare("ColbertNegativeCELoss", rng, kernel_calls, expect_kernel=False)
    assert kernel_calls["n"] == 0


@pytest.mark.parametrize(
    ("equation", "max_sum", "doc_shape"),
    [
        ("bnd,csd->bcns", (3, 2), (4, LD, DIM)),
        ("bnd,bsd->bns", (2, 1), (B, LD, DIM)),
        ("bnd,bld->bnl", (2, 1), (B, LD, DIM)),
        ("bnd,blsd->blns", (3, 2), (B, NNEG, LD, DIM)),
        ("bnd,bsld->bsnl", (3, 2), (B, NNEG, LD, DIM)),
    ],
)
def test_every_loss_equation_is_fused_exactly(equation, max_sum, doc_shape, rng, kernel_calls):
    """The einsum + ``_aggregate`` pairs of every supported version (0.3.11 on), through the real
    ``ColbertModule._aggregate``; zero padding (left and right) keeps its similarity-0 vote."""
    q = torch.nn.functional.normalize(torch.randn(B, LQ, DIM, generator=rng), dim=-1)
    d = torch.nn.functional.normalize(torch.randn(*doc_shape, generator=rng), dim=-1)
    q[1, 3:] = 0
    d.reshape(-1, LD, DIM)[0, 4:] = 0
    d.reshape(-1, LD, DIM)[1, :5] = 0  # left padding
    d.reshape(-1, LD, DIM)[-1] = 0  # an all-padding document
    q.requires_grad_(True)
    d.requires_grad_(True)
    module = losses.ColbertLoss()
    want = module._aggregate(torch.einsum(equation, q, d), False, *max_sum)
    patch_colpali_engine()
    pending = losses.torch.einsum(equation, q, d)
    assert isinstance(pending, colpali_patch._PendingMaxSim)
    got = module._aggregate(pending, False, *max_sum)
    assert kernel_calls["n"] == 1
    assert_close(got, want.double(), tol=1e-5, name=equation)
    g = torch.randn(want.shape, generator=rng)
    got_q = torch.autograd.grad(got, q, g)[0]
    want_q = torch.autograd.grad(want, q, g)[0]
    valid_q = q.detach().ne(0).any(-1, keepdim=True)  # padded rows: ties split differently
    assert_close(got_q * valid_q, (want_q * valid_q).double(), tol=1e-4, name="d/dquery")


def test_pending_scores_used_elsewhere_are_the_einsum(rng):
    patch_colpali_engine()
    q = torch.randn(2, 3, 8, generator=rng)
    d = torch.randn(4, 5, 8, generator=rng)
    pending = losses.torch.einsum("bnd,csd->bcns", q, d)
    want = torch.einsum("bnd,csd->bcns", q, d)
    assert torch.equal(pending.amax(dim=3), want.amax(dim=3))
    assert torch.equal(torch.logsumexp(pending, dim=3), torch.logsumexp(want, dim=3))


def test_score_multi_vector_replacement_matches_original(rng, kernel_calls):
    """The scorer that versions without their own backend get, against the einsum scorer."""

    def einsum_scorer(qs, ps, batch_size=128, device=None):
        # pads block by block as colpali-engine does: a zero padding row takes part in the max
        # (similarity 0), so the padding a document gets depends on its block
        pad = torch.nn.utils.rnn.pad_sequence
        rows = []
        for i in range(0, len(qs), batch_size):
            q = pad(list(qs[i : i + batch_size]), batch_first=True)
            blocks = [
                torch.einsum("bnd,csd->bcns", q, pad(list(ps[j : j + batch_size]), batch_first=True))
                .amax(dim=3)
                .sum(dim=2)
                for j in range(0, len(ps), batch_size)
            ]
            rows.append(torch.cat(blocks, dim=1))
        return torch.cat(rows, dim=0).float()

    qs = [torch.randn(n, DIM, generator=rng) for n in (3, 5, 1)]
    ps = [torch.randn(n, DIM, generator=rng) for n in (6, 2, 7, 4)]
    scorer = colpali_patch._make_score_multi_vector(einsum_scorer, lambda _: "cpu")
    got = scorer(qs, ps, batch_size=2)
    assert kernel_calls["n"] == 4  # 2 query blocks x 2 passage blocks
    assert got.dtype == torch.float32 and got.device.type == "cpu"
    want = einsum_scorer(qs, ps, batch_size=2).double()
    assert_close(got, want, tol=1e-5, name="score_multi_vector")


@pytest.mark.skipif(
    colpali_patch.has_native_backend(), reason="left to colpali-engine's own backend there"
)
def test_score_multi_vector_is_patched_on_versions_without_a_backend(rng, kernel_calls):
    base = processing_utils.BaseVisualRetrieverProcessor
    qs = [torch.randn(n, DIM, generator=rng) for n in (3, 5, 1)]
    ps = [torch.randn(n, DIM, generator=rng) for n in (6, 2, 7)]
    want = base.score_multi_vector(qs, ps, batch_size=2, device="cpu")
    patch_colpali_engine()
    got = base.score_multi_vector(qs, ps, batch_size=2, device="cpu")
    assert kernel_calls["n"] == 4
    assert_close(got, want.double(), tol=1e-5, name="score_multi_vector")


def test_idempotent_and_reversible_by_identity():
    base = processing_utils.BaseVisualRetrieverProcessor
    before = {
        "torch": losses.torch,
        "_aggregate": losses.ColbertModule.__dict__["_aggregate"],
        "score_multi_vector": base.__dict__["score_multi_vector"],
    }
    assert patch_colpali_engine()
    first = losses.ColbertModule.__dict__["_aggregate"]
    assert first is not before["_aggregate"]
    assert patch_colpali_engine()
    assert losses.ColbertModule.__dict__["_aggregate"] is first  # not wrapped twice
    unpatch_colpali_engine()
    unpatch_colpali_engine()
    assert losses.torch is before["torch"] is torch
    assert losses.ColbertModule.__dict__["_aggregate"] is before["_aggregate"]
    assert base.__dict__["score_multi_vector"] is before["score_multi_vector"]
    assert "_aggregate" not in losses.ColbertLoss.__dict__


def test_environment_variable_disables(monkeypatch):
    monkeypatch.setenv(_patching.DISABLE_ENV_VAR, "1")
    before = losses.ColbertModule.__dict__["_aggregate"]
    assert patch_colpali_engine() is False
    assert losses.ColbertModule.__dict__["_aggregate"] is before
    assert losses.torch is torch


@pytest.mark.parametrize("found", ["0.3.10", "1.0.0"])
def test_versions_outside_the_range_are_refused(found, monkeypatch):
    monkeypatch.setattr(_patching, "version", lambda dist: found)
    with pytest.raises(UnsupportedVersionError, match=rf"colpali-engine {found} .*>=0\.3\.11,<1"):
        patch_colpali_engine()
    assert losses.torch is torch


def test_log_line_names_what_was_patched(caplog):
    with caplog.at_level(logging.INFO, logger="late_interaction_kernels.integrations"):
        patch_colpali_engine()
    assert any("patched colpali-engine" in r.getMessage() for r in caplog.records)
