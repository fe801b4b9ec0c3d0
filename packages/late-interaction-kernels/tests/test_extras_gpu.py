"""CUDA checks of the ops built on ``maxsim`` (bf16 inputs, compiled kernels)."""

from __future__ import annotations

import pytest
import torch

from late_interaction_kernels import autograd
from late_interaction_kernels.ops.maxsim.reference import maxsim_reference
from late_interaction_kernels.ops.maxsim_from_hidden import maxsim_from_hidden
from late_interaction_kernels.ops.maxsim_from_hidden.reference import (
    maxsim_from_hidden_reference,
    project,
)
from late_interaction_kernels.ops.maxsim_residual import maxsim_residual
from late_interaction_kernels.ops.maxsim_residual.reference import (
    maxsim_residual_reference,
    pack_buckets,
)
from late_interaction_kernels.ops.retrieve import retrieve
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
    scores, ids = retrieve(q, d, 10, chunk_size=300)
    full = maxsim_reference(q.double(), d.double())
    assert_close(scores, full.gather(1, ids), dtype=torch.bfloat16)
    assert_close(scores, full.topk(10, dim=1).values, dtype=torch.bfloat16)


def _from_hidden_with_winners(Q, H, W, winners):
    """float64 ``maxsim_from_hidden`` whose max picks the given document tokens ``(Nq, Lq, Nd)``."""
    D = project(H, W, None, True)
    sim = torch.einsum("qid,njd->qnij", Q, D)  # (Nq, Nd, Lq, Ld)
    return sim.gather(3, winners.permute(0, 2, 1)[..., None]).squeeze(3).sum(2)


def test_from_hidden_bf16_gradients():
    """bf16 rounding of the projected documents moves some winners away from the float64 ones
    (near ties among 96 tokens), and each move changes a gradient row by a whole token vector. So
    the values are compared with the plain float64 reference, the gradients with the float64
    formula evaluated at the winners of the bf16 projection the kernels saw."""
    g = torch.Generator().manual_seed(2)
    args = [
        torch.randn(4, 32, 128, generator=g),
        torch.randn(40, 96, 256, generator=g),
        torch.randn(256, 128, generator=g) / 16,
    ]
    leaves = [a.cuda().bfloat16().requires_grad_(True) for a in args]
    refs = [a.detach().double().requires_grad_(True) for a in leaves]
    got = maxsim_from_hidden(*leaves, chunk_size=16)
    assert_close(got, maxsim_from_hidden_reference(*refs), dtype=torch.bfloat16)
    with torch.no_grad():
        # projected 16 documents at a time, as maxsim_from_hidden does (same bf16 rounding)
        d16 = torch.cat(
            [project(h, leaves[2], None, True) for h in leaves[1].split(16)]
        ).double()
        winners = torch.einsum("qid,njd->qinj", refs[0], d16).argmax(-1)  # (Nq, Lq, Nd)
    want = _from_hidden_with_winners(*refs, winners)
    grad = torch.randn(got.shape, generator=g).cuda()
    got.backward(grad)
    want.backward(grad.double())
    for x, r in zip(leaves, refs):
        assert_close(x.grad, r.grad, dtype=torch.bfloat16)


def test_residual_bf16():
    g = torch.Generator().manual_seed(3)
    doclens = torch.randint(0, 80, (50,), generator=g)
    n = int(doclens.sum())
    centroids = torch.nn.functional.normalize(torch.randn(64, 128, generator=g), dim=-1)
    codes = torch.randint(0, 64, (n,), generator=g)
    packed = pack_buckets(torch.randint(0, 4, (n, 128), generator=g), 2)
    weights = torch.linspace(-0.1, 0.1, 4)
    q = torch.randn(4, 32, 128, generator=g)
    parts = [t.cuda() for t in (centroids, codes, packed, weights, doclens)]
    with torch.no_grad():
        got = maxsim_residual(q.cuda().bfloat16(), *parts, nbits=2, chunk_size=16)
    want = maxsim_residual_reference(q.double().cuda(), *parts, nbits=2)
    assert_close(got, want, dtype=torch.bfloat16)
