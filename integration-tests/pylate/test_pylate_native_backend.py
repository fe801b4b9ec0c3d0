"""PyLate's own backend switch (``backend="lik"`` / ``PYLATE_SCORES_BACKEND=lik``) finds this
package (``late_interaction_kernels.autograd.maxsim`` and ``maxsim_pairs``) and gets the numbers
of its torch path, masks included.

The switch only offers itself on CUDA/MPS; the tests let it accept CPU tensors so that PyLate's
real dispatch code runs here, with the kernels in the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from triton_dispatch.testing import assert_close

pytest.importorskip("pylate", reason="needs the 'pylate' extra of late-interaction-kernels")
colbert = pytest.importorskip("pylate.scores.colbert")
lik_backend = pytest.importorskip(
    "pylate.scores._lik_backend", reason="PyLate without a lik backend"
)

DIM = 16


@pytest.fixture(autouse=True)
def lik_on_cpu(monkeypatch):
    monkeypatch.setattr(colbert, "_try_lik", lambda backend, *tensors: backend in ("auto", "lik"))
    monkeypatch.setattr(lik_backend, "_lik_device", lambda query, doc: "cuda")


def both(fn, leaves):
    out = {}
    for backend in ("torch", "lik"):
        value = fn(backend)
        out[backend] = (
            value.detach(),
            torch.autograd.grad(value.sum(), leaves, retain_graph=True),
        )
    return out


def check(out, name):
    assert_close(out["lik"][0], out["torch"][0].double(), tol=1e-5, name=name)
    for g, w in zip(out["lik"][1], out["torch"][1]):
        assert_close(g, w.double(), tol=1e-4, name=f"{name} gradient")


def normalized(rng, *shape):
    raw = torch.randn(*shape, generator=rng).requires_grad_(True)
    return raw, F.normalize(raw, dim=-1)


def test_colbert_scores_with_float_masks(rng, kernel_calls):
    q_raw, q = normalized(rng, 3, 5, DIM)
    d_raw, d = normalized(rng, 4, 6, DIM)
    q_mask = (torch.rand(3, 5, generator=rng) > 0.3).float()
    d_mask = (torch.rand(4, 6, generator=rng) > 0.4).float()
    d_mask[2] = 0
    out = both(lambda b: colbert.colbert_scores(q, d, q_mask, d_mask, backend=b), (q_raw, d_raw))
    assert kernel_calls["n"] == 1
    check(out, "colbert_scores")


def test_colbert_kd_scores_with_masks(rng, kernel_calls):
    q_raw, q = normalized(rng, 3, 5, DIM)
    d_raw, d = normalized(rng, 3, 2, 6, DIM)
    d_mask = torch.rand(3, 2, 6, generator=rng) > 0.4
    out = both(
        lambda b: colbert.colbert_kd_scores(q, d, documents_mask=d_mask, backend=b), (q_raw, d_raw)
    )
    assert kernel_calls["n"] == 1
    check(out, "colbert_kd_scores")


def test_colbert_scores_pairwise(rng, kernel_calls):
    q_raw, q = normalized(rng, 3, 5, DIM)
    d_raw, d = normalized(rng, 3, 6, DIM)
    out = both(lambda b: colbert.colbert_scores_pairwise(q, d, backend=b), (q_raw, d_raw))
    assert kernel_calls["n"] == 1
    check(out, "colbert_scores_pairwise")
