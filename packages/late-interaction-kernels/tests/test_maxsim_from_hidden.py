"""maxsim_from_hidden against project + normalise + MaxSim in float64, gradients included."""

from __future__ import annotations

import pytest
import torch

from late_interaction_kernels.ops.maxsim_from_hidden import maxsim_from_hidden
from late_interaction_kernels.ops.maxsim_from_hidden.reference import (
    maxsim_from_hidden_reference,
)
from triton_dispatch.testing import assert_gradients_match

NQ, LQ, ND, LD, H, DIM = 2, 3, 5, 4, 12, 8


def _inputs(rng, *, bias=True):
    Q = torch.nn.functional.normalize(torch.randn(NQ, LQ, DIM, generator=rng), dim=-1)
    H_d = torch.randn(ND, LD, H, generator=rng)
    W = torch.randn(H, DIM, generator=rng) / H**0.5
    b = torch.randn(DIM, generator=rng) if bias else None
    d_mask = torch.rand(ND, LD, generator=rng) > 0.3
    d_mask[:, 0] = True
    q_mask = torch.rand(NQ, LQ, generator=rng) > 0.2
    return Q, H_d, W, b, d_mask, q_mask


@pytest.mark.parametrize("chunk_size", [2, 64])  # 2: chunked and checkpointed
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_values_and_gradients(chunk_size, normalize, bias, rng):
    Q, H_d, W, b, d_mask, q_mask = _inputs(rng, bias=bias)
    leaves = [t.requires_grad_(True) if t is not None else None for t in (Q, H_d, W, b)]
    assert_gradients_match(
        lambda q, h, w, bb: maxsim_from_hidden(
            q, h, w, bb, d_mask, q_mask=q_mask, normalize=normalize, chunk_size=chunk_size
        ),
        lambda q, h, w, bb: maxsim_from_hidden_reference(
            q, h, w, bb, d_mask, q_mask=q_mask, normalize=normalize
        ),
        leaves,
        generator=torch.Generator().manual_seed(0),
        names=["Q", "H_d", "W", "b"],
        grad_tol=1e-4,
    )


def test_fully_masked_document_scores_zero_with_zero_gradient(rng):
    Q, H_d, W, b, d_mask, _ = _inputs(rng)
    d_mask[2] = False
    leaves = [t.requires_grad_(True) for t in (Q, H_d, W, b)]
    scores = maxsim_from_hidden(Q, H_d, W, b, d_mask, chunk_size=2)
    assert torch.equal(scores[:, 2], torch.zeros(NQ))
    for g in torch.autograd.grad(scores[:, 2].sum(), leaves, allow_unused=True):
        assert g is None or torch.equal(g, torch.zeros_like(g))


def test_no_documents(rng):
    Q, H_d, W, b, _, _ = _inputs(rng)
    out = maxsim_from_hidden(Q, H_d[:0], W, b)
    assert out.shape == (NQ, 0)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"Q": torch.zeros(NQ, DIM)}, ValueError, r"Q must be a floating \(Nq, Lq, d\)"),
        ({"H_d": torch.zeros(ND, LD, H, dtype=torch.long)}, ValueError, "H_d must be a floating"),
        ({"W": torch.zeros(H + 1, DIM)}, ValueError, "W must be"),
        ({"W": torch.zeros(H, DIM + 1)}, ValueError, "W projects to d"),
        ({"b": torch.zeros(DIM + 1)}, ValueError, "b must be"),
        ({"W": torch.zeros(H, DIM, dtype=torch.float64)}, TypeError, "share one dtype"),
        ({"d_mask": torch.ones(ND, LD)}, ValueError, "d_mask must be a bool"),
        ({"q_mask": torch.ones(NQ, LQ + 1, dtype=torch.bool)}, ValueError, "q_mask must be a bool"),
        ({"chunk_size": 0}, ValueError, "chunk_size"),
    ],
)
def test_bad_inputs_are_named(change, error, message, rng):
    Q, H_d, W, b, d_mask, q_mask = _inputs(rng)
    args = {
        "Q": Q,
        "H_d": H_d,
        "W": W,
        "b": b,
        "d_mask": d_mask,
        "q_mask": q_mask,
        "chunk_size": None,
    }
    args.update(change)
    with pytest.raises(error, match=message):
        maxsim_from_hidden(
            args["Q"],
            args["H_d"],
            args["W"],
            args["b"],
            args["d_mask"],
            q_mask=args["q_mask"],
            chunk_size=args["chunk_size"],
        )
