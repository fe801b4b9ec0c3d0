"""colpali-engine's own backend switch (``COLPALI_SCORES_BACKEND``, 0.3.17 and newer) finds this
package through ``late_interaction_kernels.autograd`` and gets the numbers of its einsum path.

The backend only offers itself on CUDA/MPS; the tests let it accept CPU tensors so that its real
dispatch code runs here, with the kernels in the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from late_interaction_kernels.integrations import patch_colpali_engine, unpatch_colpali_engine
from triton_dispatch.testing import assert_close

pytest.importorskip(
    "colpali_engine", reason="needs the 'colpali' extra of late-interaction-kernels"
)
maxsim_module = pytest.importorskip(
    "colpali_engine.utils.maxsim", reason="colpali-engine < 0.3.17 has no backend switch"
)
from colpali_engine.loss import late_interaction_losses as losses  # noqa: E402
from colpali_engine.utils import _lik_backend  # noqa: E402
from colpali_engine.utils.processing_utils import BaseVisualRetrieverProcessor  # noqa: E402

DIM = 16


@pytest.fixture
def lik_backend(monkeypatch, kernel_calls):
    """Lets colpali-engine's backend take CPU tensors; counts the calls reaching the kernels."""
    monkeypatch.setattr(_lik_backend, "is_available", lambda: True)
    monkeypatch.setattr(_lik_backend, "_lik_device", lambda query, doc: "cuda")
    monkeypatch.setenv("COLPALI_SCORES_BACKEND", "lik")
    yield kernel_calls
    unpatch_colpali_engine()


def padded(rng, *shape, lengths, left=False):
    raw = torch.randn(*shape, generator=rng).requires_grad_(True)
    length = shape[-2]
    lens = torch.tensor(lengths).reshape(*shape[:-2], 1)
    pos = torch.arange(length)
    valid = pos >= length - lens if left else pos < lens
    return raw, F.normalize(raw, dim=-1) * valid.unsqueeze(-1)


def both_backends(monkeypatch, fn, *leaves):
    out = {}
    for backend in ("torch", "lik"):
        monkeypatch.setenv("COLPALI_SCORES_BACKEND", backend)
        value = fn()
        g = torch.autograd.grad(value.sum() if value.dim() else value, leaves, retain_graph=True)
        out[backend] = (value.detach(), g)
    return out


@pytest.mark.parametrize("left", [False, True])
def test_inbatch_and_kd_scores_match_the_torch_backend(left, rng, monkeypatch, lik_backend):
    q_raw, q = padded(rng, 3, 5, DIM, lengths=[5, 2, 4])
    d_raw, d = padded(rng, 4, 6, DIM, lengths=[6, 1, 3, 5], left=left)
    n_raw, n = padded(rng, 3, 2, 6, DIM, lengths=[6, 2, 4, 3, 5, 1], left=left)
    for fn, leaves in (
        (lambda: maxsim_module.maxsim_inbatch(q, d), (q_raw, d_raw)),
        (lambda: maxsim_module.maxsim_kd(q, n), (q_raw, n_raw)),
    ):
        before = lik_backend["n"]
        out = both_backends(monkeypatch, fn, *leaves)
        assert lik_backend["n"] == before + 1, "the lik backend did not reach the kernels"
        assert_close(out["lik"][0], out["torch"][0].double(), tol=1e-5, name="scores")
        for g, w in zip(out["lik"][1], out["torch"][1]):
            assert_close(g, w.double(), tol=1e-4, name="gradient")


def test_patched_negative_loss_is_fully_fused_and_equal(rng, monkeypatch, lik_backend):
    q_raw, q = padded(rng, 3, 5, DIM, lengths=[5, 2, 4])
    d_raw, d = padded(rng, 3, 6, DIM, lengths=[6, 1, 3])
    n_raw, n = padded(rng, 3, 2, 6, DIM, lengths=[6, 2, 4, 3, 5, 1])
    loss = losses.ColbertPairwiseNegativeCELoss(in_batch_term_weight=0.5)
    monkeypatch.setenv("COLPALI_SCORES_BACKEND", "torch")
    want = loss(q, d, n)
    want_g = torch.autograd.grad(want, (q_raw, d_raw, n_raw), retain_graph=True)
    monkeypatch.setenv("COLPALI_SCORES_BACKEND", "lik")
    patch_colpali_engine()
    got = loss(q, d, n)
    got_g = torch.autograd.grad(got, (q_raw, d_raw, n_raw), retain_graph=True)
    # in-batch grid + negative slab through colpali's backend, positive term through the patch
    assert lik_backend["n"] == 3
    assert_close(got.detach(), want.detach().double(), tol=1e-5, name="loss")
    for g, w in zip(got_g, want_g):
        assert_close(g, w.double(), tol=1e-4, name="gradient")


def test_score_multi_vector_through_the_backend(rng, monkeypatch, lik_backend):
    qs = [torch.randn(n, DIM, generator=rng) for n in (3, 5, 1)]
    ps = [torch.randn(n, DIM, generator=rng) for n in (6, 2, 7)]
    monkeypatch.setenv("COLPALI_SCORES_BACKEND", "torch")
    want = BaseVisualRetrieverProcessor.score_multi_vector(qs, ps, batch_size=2, device="cpu")
    monkeypatch.setenv("COLPALI_SCORES_BACKEND", "lik")
    got = BaseVisualRetrieverProcessor.score_multi_vector(qs, ps, batch_size=2, device="cpu")
    assert lik_backend["n"] == 4
    assert got.dtype == torch.float32
    assert_close(got, want.double(), tol=1e-5, name="score_multi_vector")
