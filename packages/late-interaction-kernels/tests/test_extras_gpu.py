"""CUDA checks of the ops built on ``maxsim`` (bf16 inputs, compiled kernels)."""

from __future__ import annotations

import pytest
import torch

from late_interaction_kernels import autograd
from late_interaction_kernels.ops.maxsim.reference import maxsim_reference
from late_interaction_kernels.ops.maxsim_from_hidden import maxsim_from_hidden
from late_interaction_kernels.ops.maxsim_from_hidden.op import FROM_HIDDEN
from late_interaction_kernels.ops.maxsim_from_hidden.reference import (
    maxsim_from_hidden_reference,
    project,
)
from late_interaction_kernels.ops.maxsim_residual import maxsim_residual
from late_interaction_kernels.ops.maxsim_residual.op import residual_forward_op
from late_interaction_kernels.ops.maxsim_residual.reference import (
    decompress,
    maxsim_residual_reference,
    pack_buckets,
)
from late_interaction_kernels.ops.retrieve import MaxSimIndex
from triton_dispatch.testing import assert_close

pytestmark = pytest.mark.gpu


def test_autograd_entry_bf16_zero_padding():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(8, 32, 128, generator=g)
    d = torch.randn(16, 300, 128, generator=g)
    d[3, 100:] = 0
    q[2, 20:] = 0
    got = autograd.maxsim(q.cuda().bfloat16(), d.cuda().bfloat16())
    want = torch.einsum("bnd,csd->bcns", q.bfloat16().double(), d.bfloat16().double())
    assert_close(got, want.amax(3).sum(2).to(got.device), dtype=torch.bfloat16)


def test_retrieve_bf16():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(4, 32, 128, generator=g).cuda().bfloat16()
    d = torch.randn(1000, 64, 128, generator=g).cuda().bfloat16()
    scores, ids = MaxSimIndex(d, chunk_size=300).topk(q, 10)
    full = maxsim_reference(q.double(), d.double())
    assert_close(scores, full.gather(1, ids), dtype=torch.bfloat16)
    assert_close(scores, full.topk(10, dim=1).values, dtype=torch.bfloat16)


def _from_hidden_at_winners(Q, H, W, b, winners):
    """float64 ``maxsim_from_hidden`` whose max picks the given document-local token of every
    (query, document, query token) ``(Nq, Nd, Lq)`` (-1: contributes 0)."""
    D = project(H, W, b, True)
    sim = torch.einsum("qid,njd->qnij", Q, D)  # (Nq, Nd, Lq, Ld)
    picked = sim.gather(3, winners.clamp(min=0).long()[..., None]).squeeze(3)
    return torch.where(winners >= 0, picked, 0.0).sum(2)


@pytest.mark.parametrize(
    ("dtype", "dim", "tol"), [(torch.bfloat16, 128, None), (torch.float16, 96, 1e-2)]
)
def test_from_hidden_fused_values_and_gradients(dtype, dim, tol):
    """bf16/fp16 rounding of the projected documents moves some winners away from the float64
    ones (near ties among hundreds of tokens), and each move changes a gradient row by a whole
    token vector. So values are compared with the plain float64 reference, gradients with the
    float64 formula evaluated at the winners the kernel saved."""
    g = torch.Generator().manual_seed(2)
    nq, lq, nd, ld, h = 8, 32, 48, 300, 768
    args = [
        torch.randn(nq, lq, dim, generator=g),
        torch.randn(nd, ld, h, generator=g),
        torch.randn(h, dim, generator=g) / h**0.5,
        torch.randn(dim, generator=g) * 0.1,
    ]
    d_mask = torch.arange(ld)[None, :] < torch.randint(1, ld + 1, (nd, 1), generator=g)
    d_mask[5] = False  # a fully masked document
    d_mask = d_mask.cuda()
    leaves = [a.cuda().to(dtype).requires_grad_(True) for a in args]
    refs = [a.detach().double().requires_grad_(True) for a in leaves]
    got = maxsim_from_hidden(*leaves, d_mask, chunk_size=16, fused=True)
    assert_close(got, maxsim_from_hidden_reference(*refs, d_mask), dtype=dtype, tol=tol)
    with torch.no_grad():
        _, winners = FROM_HIDDEN.op(
            *leaves, d_mask, None, normalize=True, chunk_size=16, save_argmax=True
        )
    want = _from_hidden_at_winners(*refs, winners)
    grad = torch.randn(got.shape, generator=g).cuda()
    got.backward(grad)
    want.backward(grad.double())
    for name, x, r in zip(["Q", "H_d", "W", "b"], leaves, refs):
        assert_close(x.grad, r.grad, dtype=dtype, tol=tol, name=f"gradient of {name}")
    assert torch.equal(leaves[1].grad[5], torch.zeros_like(leaves[1].grad[5]))
    assert torch.equal(got[:, 5], torch.zeros_like(got[:, 5]))


def test_from_hidden_compiles_fullgraph():
    g = torch.Generator().manual_seed(4)
    args = [
        torch.randn(16, 32, 128, generator=g),
        torch.randn(16, 180, 256, generator=g),
        torch.randn(256, 128, generator=g) / 16,
        torch.randn(128, generator=g) * 0.1,
    ]
    d_mask = (torch.rand(16, 180, generator=g) > 0.2).cuda()
    compiled = torch.compile(maxsim_from_hidden, fullgraph=True)
    results = []
    for fn in (maxsim_from_hidden, compiled):
        leaves = [a.cuda().bfloat16().requires_grad_(True) for a in args]
        scores = fn(*leaves, d_mask, fused=True)
        scores.backward(torch.ones_like(scores))
        results.append([scores] + [t.grad for t in leaves])
    for name, eager, comp in zip(["scores", "Q", "H_d", "W", "b"], *results):
        # grad_Q/grad_D use fp32 atomics: the order of additions may differ between runs
        assert_close(comp.float(), eager.double(), tol=2e-3, name=name)


def test_from_hidden_never_materialises_the_projection():
    g = torch.Generator().manual_seed(5)
    nq, nd, ld, h, dim = 4, 512, 512, 256, 128
    q = torch.randn(nq, 32, dim, generator=g).cuda().bfloat16()
    hidden = torch.randn(nd, ld, h, generator=g).cuda().bfloat16()
    w = (torch.randn(h, dim, generator=g) / 16).cuda().bfloat16()
    projected_bytes = nd * ld * dim * 2
    with torch.no_grad():
        maxsim_from_hidden(q, hidden, w, fused=True)  # compile first
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        scores = maxsim_from_hidden(q, hidden, w, fused=True)
        torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    assert extra < projected_bytes // 16, (
        f"{extra} bytes allocated, projection is {projected_bytes}"
    )
    want = maxsim_reference(q.double(), project(hidden[:64].double(), w.double(), None, True))
    assert_close(scores[:, :64], want, dtype=torch.bfloat16)


def _residual_collection(g, n_docs, max_len, dim, nbits, min_len=1):
    doclens = torch.randint(min_len, max_len + 1, (n_docs,), generator=g)
    n = int(doclens.sum())
    centroids = torch.nn.functional.normalize(torch.randn(64, dim, generator=g), dim=-1)
    codes = torch.randint(0, 64, (n,), generator=g)
    packed = pack_buckets(torch.randint(0, 1 << nbits, (n, dim), generator=g), nbits)
    weights = torch.sort(torch.randn(1 << nbits, generator=g) * 0.05).values
    return [t.cuda() for t in (centroids, codes, packed, weights, doclens)]


@pytest.mark.parametrize("nbits", [1, 2, 4, 8])
@pytest.mark.parametrize(("dim", "lq"), [(128, 32), (96, 32), (64, 300)])
def test_residual_fused_values_and_gradients(nbits, dim, lq):
    """Values against the float64 reference; the query gradient against the float64 formula at
    the winners the kernel saved (bf16 rounding may move near-tie winners)."""
    g = torch.Generator().manual_seed(3 + nbits + dim)
    parts = _residual_collection(g, 50, 150, dim, nbits)
    q = torch.randn(4, lq, dim, generator=g).cuda().bfloat16().requires_grad_(True)
    q_mask = (torch.rand(4, lq, generator=g) > 0.1).cuda()
    got = maxsim_residual(q, *parts, nbits=nbits, q_mask=q_mask)
    q64 = q.detach().double().requires_grad_(True)
    assert_close(
        got,
        maxsim_residual_reference(q64, *parts, nbits=nbits, q_mask=q_mask),
        dtype=torch.bfloat16,
    )
    offsets = torch.cat([parts[4].new_zeros(1), parts[4].cumsum(0)])
    with torch.no_grad():
        _, winners = residual_forward_op(q, q_mask, *parts[:4], offsets, nbits, True)
    tokens = decompress(*parts[:4], nbits).double()
    picked = torch.einsum("qid,qnid->qni", q64, tokens[winners.clamp(min=0)])
    want = torch.where(winners >= 0, picked, 0.0).sum(2)
    grad = torch.randn(got.shape, generator=g).cuda()
    got.backward(grad)
    want.backward(grad.double())
    assert_close(q.grad, q64.grad, dtype=torch.bfloat16, name="gradient of Q")


def test_residual_zero_length_documents_and_compile():
    g = torch.Generator().manual_seed(6)
    parts = _residual_collection(g, 40, 90, 128, 2, min_len=0)
    q = torch.randn(8, 32, 128, generator=g).cuda().bfloat16()
    with torch.no_grad():
        eager = maxsim_residual(q, *parts, nbits=2)
        compiled = torch.compile(maxsim_residual, fullgraph=True)(q, *parts, nbits=2)
    want = maxsim_residual_reference(q.double(), *parts, nbits=2)
    assert_close(eager, want, dtype=torch.bfloat16)
    assert torch.equal(eager[:, parts[4] == 0], torch.zeros_like(eager[:, parts[4] == 0]))
    torch.testing.assert_close(compiled, eager)
    parts[4].clamp_(min=1)  # no empty document: differentiable, under compile too
    parts[1] = parts[1].new_zeros(int(parts[4].sum()))
    parts[2] = parts[2].new_zeros((int(parts[4].sum()), parts[2].shape[1]))
    leaf = q.clone().requires_grad_(True)
    scores = torch.compile(maxsim_residual, fullgraph=True)(leaf, *parts, nbits=2)
    scores.sum().backward()
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()


def test_residual_never_decompresses_the_collection():
    g = torch.Generator().manual_seed(7)
    n_docs, per_doc, dim = 20000, 128, 128
    tokens = n_docs * per_doc
    centroids = torch.nn.functional.normalize(torch.randn(1024, dim, generator=g), dim=-1).cuda()
    codes = torch.randint(0, 1024, (tokens,), generator=g).cuda()
    packed = torch.randint(0, 256, (tokens, dim // 4), generator=g).to(torch.uint8).cuda()
    weights = torch.linspace(-0.05, 0.05, 4).cuda()
    doclens = torch.full((n_docs,), per_doc).cuda()
    q = torch.randn(8, 32, dim, generator=g).cuda().bfloat16()
    decompressed_bytes = tokens * dim * 2
    with torch.no_grad():
        maxsim_residual(q, centroids, codes, packed, weights, doclens, nbits=2)  # compile first
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        maxsim_residual(q, centroids, codes, packed, weights, doclens, nbits=2)
        torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    # the kernel's (Nq, Nd, Lq) fp32 running-max scratch (20 MB here) and one bool mask of it
    assert extra < decompressed_bytes // 16, f"{extra} bytes; decompressed: {decompressed_bytes}"
