"""maxsim_from_hidden against project + normalise + MaxSim in float64, gradients included."""

from __future__ import annotations

import pytest
import torch

from late_interaction_kernels.ops.maxsim_from_hidden import maxsim_from_hidden
from late_interaction_kernels.ops.maxsim_from_hidden.op import FROM_HIDDEN
from late_interaction_kernels.ops.maxsim_from_hidden.reference import (
    maxsim_from_hidden_reference,
    project,
)
from triton_dispatch.testing import assert_close, assert_gradients_match

NQ, LQ, ND, LD, H, DIM = 2, 3, 5, 4, 12, 8


def _inputs(rng, *, bias=True, shape=(NQ, LQ, ND, LD, H, DIM), dtype=torch.float32, device="cpu"):
    nq, lq, nd, ld, h, dim = shape
    Q = torch.nn.functional.normalize(torch.randn(nq, lq, dim, generator=rng), dim=-1)
    H_d = torch.randn(nd, ld, h, generator=rng)
    W = torch.randn(h, dim, generator=rng) / h**0.5
    b = torch.randn(dim, generator=rng) if bias else None
    d_mask = torch.rand(nd, ld, generator=rng) > 0.3
    d_mask[:, 0] = True
    q_mask = torch.rand(nq, lq, generator=rng) > 0.2
    Q, H_d, W = (t.to(device, dtype) for t in (Q, H_d, W))
    b = None if b is None else b.to(device, dtype)
    return Q, H_d, W, b, d_mask.to(device), q_mask.to(device)


# the Triton path (interpreted here) with documents of several 16-token tiles split over two
# programs, a hidden size spanning two K-steps, and a width that is not a power of two
FUSED_SHAPE = (3, 5, 3, 37, 20, 24)


@pytest.mark.parametrize(
    ("chunk_size", "backend", "shape"),
    [
        (2, "torch", (NQ, LQ, ND, LD, H, DIM)),  # chunked and checkpointed
        (64, "torch", (NQ, LQ, ND, LD, H, DIM)),
        (2, None, (NQ, LQ, ND, LD, H, DIM)),
        (2, None, FUSED_SHAPE),  # the fused path, backward in two chunks
    ],
)
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_values_and_gradients(chunk_size, backend, shape, normalize, bias, rng):
    Q, H_d, W, b, d_mask, q_mask = _inputs(rng, bias=bias, shape=shape)
    leaves = [t.requires_grad_(True) if t is not None else None for t in (Q, H_d, W, b)]
    assert_gradients_match(
        lambda q, h, w, bb: maxsim_from_hidden(
            q,
            h,
            w,
            bb,
            d_mask,
            q_mask=q_mask,
            normalize=normalize,
            chunk_size=chunk_size,
            backend=backend,
            fused=backend is None,
        ),
        lambda q, h, w, bb: maxsim_from_hidden_reference(
            q, h, w, bb, d_mask, q_mask=q_mask, normalize=normalize
        ),
        leaves,
        generator=torch.Generator().manual_seed(0),
        names=["Q", "H_d", "W", "b"],
        grad_tol=1e-4,
    )


@pytest.mark.parametrize(
    ("backend", "shape"),
    [("torch", (NQ, LQ, ND, LD, H, DIM)), (None, (NQ, LQ, ND, LD, H, DIM)), (None, FUSED_SHAPE)],
)
def test_fully_masked_document_scores_zero_with_zero_gradient(backend, shape, rng):
    Q, H_d, W, b, d_mask, _ = _inputs(rng, shape=shape)
    d_mask[2] = False
    leaves = [t.requires_grad_(True) for t in (Q, H_d, W, b)]
    scores = maxsim_from_hidden(
        Q, H_d, W, b, d_mask, chunk_size=2, backend=backend, fused=backend is None
    )
    assert torch.equal(scores[:, 2], torch.zeros(shape[0]))
    for g in torch.autograd.grad(scores[:, 2].sum(), leaves, allow_unused=True, retain_graph=True):
        assert g is None or torch.equal(g, torch.zeros_like(g))
    # and inside a loss over every document, its own hidden states get exactly zero gradient
    grads = torch.autograd.grad((scores * torch.randn(scores.shape, generator=rng)).sum(), H_d)
    assert torch.equal(grads[0][2], torch.zeros_like(grads[0][2]))
    assert grads[0][0].abs().sum() > 0


@pytest.mark.parametrize("backend", ["torch", None])
def test_no_documents(backend, rng):
    Q, H_d, W, b, _, _ = _inputs(rng)
    out = maxsim_from_hidden(Q, H_d[:0], W, b, backend=backend)
    assert out.shape == (NQ, 0)


@pytest.mark.parametrize("backend", ["torch", None])
def test_zero_length_documents_and_queries(backend, rng):
    Q, H_d, W, b, _, _ = _inputs(rng)
    with torch.no_grad():
        assert torch.equal(
            maxsim_from_hidden(Q, H_d[:, :0], W, b, backend=backend), torch.zeros(NQ, ND)
        )
        assert maxsim_from_hidden(Q[:0], H_d, W, b, backend=backend).shape == (0, ND)


def test_fused_half_precision(rng, device):
    """fp16 values against the float64 reference; gradients against the float64 formula at the
    winners the kernel saved (fp16 rounding may swap near-tied winners)."""
    Q, H_d, W, b, d_mask, q_mask = _inputs(
        rng, shape=FUSED_SHAPE, dtype=torch.float16, device=device
    )
    leaves = [t.requires_grad_(True) for t in (Q, H_d, W, b)]
    refs = [t.detach().double().requires_grad_(True) for t in leaves]
    got = maxsim_from_hidden(*leaves, d_mask, q_mask=q_mask, chunk_size=2, fused=True)
    want = maxsim_from_hidden_reference(*refs, d_mask, q_mask=q_mask)
    assert_close(got, want, dtype=torch.float16, name="scores")
    with torch.no_grad():
        _, winners = FROM_HIDDEN.op(
            *leaves, d_mask, q_mask, normalize=True, chunk_size=2, save_argmax=True
        )
    sim = torch.einsum("qid,njd->qnij", refs[0], project(*refs[1:], True))
    picked = sim.gather(3, winners.clamp(min=0).long()[..., None]).squeeze(3)
    at_winners = torch.where(winners >= 0, picked, 0.0).sum(2)
    g = torch.randn(got.shape, generator=rng).to(device)
    got.backward(g)
    at_winners.backward(g.double())
    for name, x, r in zip(["Q", "H_d", "W", "b"], leaves, refs):
        assert_close(x.grad, r.grad, tol=1e-2, name=f"gradient of {name}")


def test_fused_and_torch_paths_agree(rng, device):
    Q, H_d, W, b, d_mask, q_mask = _inputs(rng, shape=FUSED_SHAPE, device=device)
    results = []
    for backend in (None, "torch"):
        leaves = [t.detach().clone().requires_grad_(True) for t in (Q, H_d, W, b)]
        scores = maxsim_from_hidden(
            *leaves, d_mask, q_mask=q_mask, backend=backend, fused=backend is None
        )
        scores.backward(
            torch.arange(scores.numel(), dtype=torch.float32, device=device).view(scores.shape)
        )
        results.append([scores.detach()] + [t.grad for t in leaves])
    for fused, plain in zip(*results):
        torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-5)


def test_fused_path_never_projects_the_documents(rng, monkeypatch, device):
    import late_interaction_kernels.ops.maxsim_from_hidden.torch_path as module

    def forbidden(*args, **kwargs):
        raise AssertionError("the Triton path built the projected documents")

    monkeypatch.setattr(module, "project", forbidden)
    Q, H_d, W, b, d_mask, _ = _inputs(rng, shape=FUSED_SHAPE, device=device)
    leaves = [t.requires_grad_(True) for t in (Q, H_d, W, b)]
    maxsim_from_hidden(*leaves, d_mask, fused=True).sum().backward()
    assert all(t.grad is not None for t in leaves)


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
        ({"normalize": 1}, TypeError, "normalize must be a bool"),
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
        "normalize": True,
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
            normalize=args["normalize"],
        )


_COMPILE_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from compile_for_hopper import compile_one
from late_interaction_kernels.ops.maxsim import backward
from late_interaction_kernels.ops.maxsim_from_hidden import kernels

sig = {{
    "Q": "*bf16", "H": "*bf16", "W": "*bf16", "B": "*bf16", "DM": "*u8", "BEST": "*fp32",
    "ARGMAX": "*i32", "q_rows": "i32", "n_doc": "i32", "lq": "i32", "ld": "i32", "hdim": "i32",
    "dim": "i32", "n_splits": "i32", "tiles_per_split": "i32", "H_BUCKET": "i32",
    "Q_BUCKET": "i32",
}}
for dtype, block_k, (bh, bq), flags in (
    ("bf16", 128, (64, 64), (True, True, True, True)),
    ("bf16", 128, (32, 128), (False, False, True, False)),
    ("fp16", 64, (64, 32), (True, True, False, True)),
    ("fp32", 128, (32, 32), (True, False, True, True)),
):
    has_b, has_dm, norm, save = flags
    cx = dict(HAS_B=has_b, HAS_DM=has_dm, NORMALIZE=norm, SAVE_ARGMAX=save, UPCAST=False,
              IEEE=dtype == "fp32", NORM_EPS=1e-12, BLOCK_T=64, BLOCK_K=block_k, BLOCK_H=bh,
              BLOCK_Q=bq)
    s = dict(sig, Q="*" + dtype, H="*" + dtype, W="*" + dtype, B="*" + dtype)
    compile_one(kernels.from_hidden_fwd_kernel, s, cx)
# the backward runs MaxSim's kernels on bf16 queries against fp32 projected tokens
common = {{"G": "*fp32", "ARGMAX": "*i32", "CUQ": "*fp32", "n_doc": "i32", "lq": "i32",
          "dim": "i32", "LQ_BUCKET": "i32"}}
cx = dict(LAYOUT=0, NORMALIZE=False, BLOCK_K=128, BLOCK_Q=32)
compile_one(backward.maxsim_grad_q_kernel,
            dict(common, D="*fp32", GQ="*bf16", docs_per_split="i32", q_rows="i32"), cx)
compile_one(backward.maxsim_grad_d_atomic_kernel, dict(common, Q="*bf16", GD="*fp32"), cx)
print("compiled")
"""


def test_kernels_compile_for_hopper(compile_on_hopper):
    compile_on_hopper(_COMPILE_SCRIPT)


def test_fullgraph_compile_of_the_fused_path(rng):
    """No graph break: the fused forward and backward are custom ops (their kernels run here in
    the interpreter inside the compiled graph)."""
    torch._dynamo.reset()
    Q, H_d, W, b, d_mask, q_mask = _inputs(rng, shape=FUSED_SHAPE)
    leaves = [t.requires_grad_(True) for t in (Q, H_d, W, b)]

    @torch.compile(fullgraph=True, backend="aot_eager")
    def loss_fn(q, h, w, bb):
        scores = maxsim_from_hidden(q, h, w, bb, d_mask, q_mask=q_mask, fused=True)
        return scores.logsumexp(-1).sum()

    assert_gradients_match(
        loss_fn,
        lambda q, h, w, bb: (
            maxsim_from_hidden_reference(q, h, w, bb, d_mask, q_mask=q_mask).logsumexp(-1).sum()
        ),
        leaves,
        generator=torch.Generator().manual_seed(0),
        names=["Q", "H_d", "W", "b"],
        grad_tol=1e-4,
    )


def test_fused_none_picks_by_measured_speed(rng, monkeypatch, device):
    """Few query rows take the fused kernel with and without gradients, returning the same bits
    both ways (the published 0.4.5's promise); many rows take the chunks."""
    import late_interaction_kernels.ops.maxsim_from_hidden.dispatch as dispatch
    import late_interaction_kernels.ops.maxsim_from_hidden.torch_path as module

    calls = []
    real = module.project
    monkeypatch.setattr(module, "project", lambda *a, **k: calls.append(1) or real(*a, **k))
    Q, H_d, W, b, d_mask, _ = _inputs(rng, shape=FUSED_SHAPE, device=device)
    with torch.no_grad():
        inference = maxsim_from_hidden(Q, H_d, W, b, d_mask)
    leaves = [t.clone().requires_grad_(True) for t in (Q, H_d, W, b)]
    training = maxsim_from_hidden(*leaves, d_mask)
    assert not calls
    assert torch.equal(training.detach(), inference)
    training.sum().backward()
    assert all(t.grad is not None for t in leaves)
    monkeypatch.setattr(dispatch, "FUSED_MAX_QUERY_ROWS", Q.shape[0] * Q.shape[1] - 1)
    with torch.no_grad():
        maxsim_from_hidden(Q, H_d, W, b, d_mask)
    assert calls
    with pytest.raises(TypeError, match="fused"):
        maxsim_from_hidden(Q, H_d, W, b, fused="yes")
