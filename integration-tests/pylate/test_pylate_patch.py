"""The real PyLate scorers and losses, patched against unpatched, on CPU through the Triton
interpreter: same scores, same losses, same gradients, PyLate's mask rule kept."""

from __future__ import annotations

import logging
import sys

import pytest
import torch
import torch.nn.functional as F

from late_interaction_kernels.integrations import (
    UnsupportedVersionError,
    _patching,
    patch_pylate,
    unpatch_pylate,
)
from triton_dispatch.testing import assert_close

pytest.importorskip("pylate", reason="needs the 'pylate' extra of late-interaction-kernels")

# imported before patching on purpose: Distillation binds its default scorer at class creation
from pylate import scores as pylate_scores
from pylate.losses import CachedContrastive, Contrastive, Distillation
from pylate.scores import colbert as colbert_module

DIM = 16
ORIGINALS = {
    "colbert_scores": colbert_module.colbert_scores,
    "colbert_kd_scores": colbert_module.colbert_kd_scores,
    "colbert_scores_pairwise": colbert_module.colbert_scores_pairwise,
}


@pytest.fixture(autouse=True)
def _unpatched():
    unpatch_pylate()
    yield
    unpatch_pylate()


def embeddings(rng, *shape):
    raw = torch.randn(*shape, generator=rng).requires_grad_(True)
    return raw, F.normalize(raw, dim=-1)


def float_mask(rng, *shape, left=False):
    """0/1 float masks with a masked token in most rows (PyLate masks with floats or bools)."""
    lengths = torch.randint(1, shape[-1] + 1, shape[:-1], generator=rng).unsqueeze(-1)
    pos = torch.arange(shape[-1])
    keep = pos >= shape[-1] - lengths if left else pos < lengths
    return keep.float()


def run(fn, leaves):
    value = fn()
    g = torch.autograd.grad(value.sum(), leaves, retain_graph=True)
    return value.detach(), g


def assert_same(got, want, name):
    assert_close(got[0], want[0].double(), tol=1e-5, name=name)
    for g, w in zip(got[1], want[1]):
        assert_close(g, w.double(), tol=1e-4, name=f"{name} gradient")


@pytest.mark.parametrize("left", [False, True])
def test_colbert_scores_matches_with_masks(left, rng, kernel_calls):
    q_raw, q = embeddings(rng, 3, 5, DIM)
    d_raw, d = embeddings(rng, 4, 6, DIM)
    q_mask, d_mask = float_mask(rng, 3, 5), float_mask(rng, 4, 6, left=left)
    d_mask[1] = 0  # a document with no valid token
    call = lambda: pylate_scores.colbert_scores(q, d, q_mask, d_mask)
    want = run(call, (q_raw, d_raw))
    patch_pylate()
    got = run(call, (q_raw, d_raw))
    assert kernel_calls["n"] == 1
    assert_same(got, want, "colbert_scores")


def test_colbert_kd_scores_matches_with_masks(rng, kernel_calls):
    q_raw, q = embeddings(rng, 3, 5, DIM)
    d_raw, d = embeddings(rng, 3, 2, 6, DIM)
    q_mask, d_mask = float_mask(rng, 3, 5).bool(), float_mask(rng, 3, 2, 6)
    call = lambda: pylate_scores.colbert_kd_scores(q, d, queries_mask=q_mask, documents_mask=d_mask)
    want = run(call, (q_raw, d_raw))
    patch_pylate()
    got = run(call, (q_raw, d_raw))
    assert kernel_calls["n"] == 1
    assert_same(got, want, "colbert_kd_scores")


def test_colbert_scores_pairwise_tensors_and_uneven_lists(rng, kernel_calls):
    q_raw, q = embeddings(rng, 3, 5, DIM)
    d_raw, d = embeddings(rng, 3, 6, DIM)
    q_list = [q[0, :5], q[1, :2], q[2, :4]]
    d_list = [d[0, :1], d[1, :6], d[2, :3]]
    for call in (
        lambda: pylate_scores.colbert_scores_pairwise(q, d),
        lambda: pylate_scores.colbert_scores_pairwise(q_list, d_list),
    ):
        unpatch_pylate()
        want = run(call, (q_raw, d_raw))
        patch_pylate()
        before = kernel_calls["n"]
        got = run(call, (q_raw, d_raw))
        assert kernel_calls["n"] == before + 1
        assert_same(got, want, "colbert_scores_pairwise")


@pytest.mark.parametrize("how", ["keyword", "environment"])
def test_backend_keyword_and_variable(how, rng, monkeypatch, kernel_calls):
    q, d = torch.randn(2, 3, DIM, generator=rng), torch.randn(2, 4, DIM, generator=rng)
    patch_pylate()
    kwargs = {}
    if how == "keyword":
        kwargs = {"backend": "torch"}
    else:
        monkeypatch.setenv("PYLATE_SCORES_BACKEND", "torch")
    torch_path = pylate_scores.colbert_scores(q, d, **kwargs)
    assert kernel_calls["n"] == 0, "backend='torch' must keep PyLate's own code"
    for requested in ("lik", "auto"):
        fused = pylate_scores.colbert_scores(q, d, backend=requested)
        assert_close(fused, torch_path.double(), tol=1e-5, name=f"backend={requested}")
    assert kernel_calls["n"] == 2
    with pytest.raises(ValueError, match="backend must be one of"):
        pylate_scores.colbert_scores(q, d, backend="nope")


def test_unsupported_device_falls_through_unchanged(rng, monkeypatch, kernel_calls):
    monkeypatch.setenv("TRITON_DISPATCH_BACKEND", "torch")  # stands for MPS / plain CPU
    q, d = torch.randn(2, 3, DIM, generator=rng), torch.randn(2, 4, DIM, generator=rng)
    want = pylate_scores.colbert_scores(q, d)
    patch_pylate()
    assert torch.equal(pylate_scores.colbert_scores(q, d), want)
    assert kernel_calls["n"] == 0


class TinyEncoder(torch.nn.Module):
    """Stands in for a ColBERT model: token embeddings from an embedding table."""

    skiplist: list[int] = [7]  # noqa: RUF012
    do_query_expansion = False

    def __init__(self, rng):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(20, DIM, generator=rng))

    def forward(self, features):
        return {"token_embeddings": self.table[features["input_ids"]]}


def features(rng, batch, length):
    ids = torch.randint(1, 20, (batch, length), generator=rng)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(batch):
        mask[row, torch.randint(1, length + 1, (1,), generator=rng).item() :] = 0
    return {"input_ids": ids, "attention_mask": mask}


def loss_and_grad(loss, model, feats, labels=None):
    # .backward(), not autograd.grad: CachedContrastive feeds its cached gradients in a hook
    model.zero_grad(set_to_none=True)
    value = loss(feats, labels)
    value.backward()
    return value.detach(), (model.table.grad.clone(),)


@pytest.mark.parametrize("name", ["Contrastive", "CachedContrastive"])
def test_contrastive_losses_match(name, rng, kernel_calls):
    model = TinyEncoder(rng)
    feats = [features(rng, 3, 4), features(rng, 3, 6), features(rng, 3, 6)]  # query, pos, hard neg
    make = lambda: (
        Contrastive(model) if name == "Contrastive" else CachedContrastive(model, mini_batch_size=2)
    )
    want = loss_and_grad(make(), model, feats)
    patch_pylate()  # after pylate.losses was imported
    got = loss_and_grad(make(), model, feats)
    assert kernel_calls["n"] > 0
    assert_close(got[0], want[0].double(), tol=1e-5, name=f"{name} loss")
    assert_close(got[1][0], want[1][0].double(), tol=1e-4, name=f"{name} gradient")


def test_distillation_default_bound_at_class_creation_is_patched(rng, kernel_calls):
    model = TinyEncoder(rng)
    n_docs = 3  # min-max normalisation of 2 scores is constant: no gradient to compare
    for _ in range(20):
        # the loss min-max normalises each query's scores: two documents that tie for the
        # maximum or minimum (short documents of the same tokens) send the gradient to either,
        # by rounding. Such draws are set aside; the comparison needs distinct scores.
        feats = [features(rng, 3, 4), features(rng, 3 * n_docs, 6)]
        labels = torch.randn(3, n_docs, generator=rng)
        reference, seen = Distillation(model), []
        metric = reference.score_metric
        reference.score_metric = lambda *a, m=metric, s=seen, **k: s.append(m(*a, **k)) or s[-1]
        want = loss_and_grad(reference, model, feats, labels)
        gaps = seen[0].detach().sort(dim=1).values.diff(dim=1)
        if (gaps > 1e-3 * (1 + seen[0].detach().abs().amax())).all():
            break
    patch_pylate()
    loss = Distillation(model)
    assert loss.score_metric is not ORIGINALS["colbert_kd_scores"]
    got = loss_and_grad(loss, model, feats, labels)
    assert kernel_calls["n"] == 1
    assert_close(got[0], want[0].double(), tol=1e-5, name="Distillation loss")
    assert_close(got[1][0], want[1][0].double(), tol=1e-4, name="Distillation gradient")


def _bindings():
    """Every place in loaded pylate modules (globals and defaults) that holds a scorer."""
    held = {}
    by_id = {id(fn): name for name, fn in ORIGINALS.items()}
    for mod_name, module in list(sys.modules.items()):
        if not mod_name.startswith("pylate") or module is None:
            continue
        for attr, value in vars(module).items():
            if callable(value) and getattr(value, "__name__", None) in ORIGINALS:
                held[(mod_name, attr)] = value
            if isinstance(value, type) and value.__module__ == mod_name:
                init = value.__dict__.get("__init__")
                for i, default in enumerate(getattr(init, "__defaults__", None) or ()):
                    if callable(default) and getattr(default, "__name__", None) in ORIGINALS:
                        held[(mod_name, attr, i)] = default
    assert by_id
    return held


def test_every_copy_is_patched_and_restored_by_identity():
    before = _bindings()
    call_before = colbert_module.ColBERTScores.__dict__["__call__"]
    assert {
        ("pylate.rank.rank", "colbert_scores"),
        ("pylate.losses.distillation", "Distillation", 0),
    } <= set(before)
    assert patch_pylate()
    patched = _bindings()
    assert patched.keys() == before.keys()
    assert all(patched[k] is not before[k] for k in before)
    assert patch_pylate()  # idempotent: nothing wrapped twice
    assert all(_bindings()[k] is patched[k] for k in before)
    unpatch_pylate()
    unpatch_pylate()
    after = _bindings()
    assert all(after[k] is before[k] for k in before)
    assert colbert_module.ColBERTScores.__dict__["__call__"] is call_before


def test_environment_variable_disables(monkeypatch):
    monkeypatch.setenv(_patching.DISABLE_ENV_VAR, "1")
    assert patch_pylate() is False
    assert pylate_scores.colbert_scores is ORIGINALS["colbert_scores"]


def test_versions_outside_the_range_are_refused(monkeypatch):
    monkeypatch.setattr(_patching, "version", lambda dist: "1.4.0")
    with pytest.raises(UnsupportedVersionError, match=r"pylate 1\.4\.0 .*>=1\.5\.1,<2"):
        patch_pylate()
    assert pylate_scores.colbert_scores is ORIGINALS["colbert_scores"]


def test_log_line_names_what_was_patched(caplog):
    with caplog.at_level(logging.INFO, logger="late_interaction_kernels.integrations"):
        patch_pylate()
    assert any("patched PyLate" in r.getMessage() for r in caplog.records)
