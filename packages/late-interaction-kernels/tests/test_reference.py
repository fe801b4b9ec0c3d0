"""The specification itself: masks, empty documents, argmax sentinel, chunking."""

import pytest
import torch

from late_interaction_kernels.ops.maxsim import reference
from late_interaction_kernels.ops.maxsim.reference import (
    maxsim_pairs_reference,
    maxsim_reference,
    maxsim_varlen_reference,
)
from triton_dispatch.testing import assert_close, rand_mask, randn


def _naive(Q, D, q_mask, d_mask):
    # the einsum a user writes, token by token in float64
    nq, nd = Q.shape[0], D.shape[0]
    out = torch.zeros(nq, nd, dtype=torch.float64)
    for i in range(nq):
        for j in range(nd):
            sim = Q[i].double() @ D[j].double().T
            total = 0.0
            for t in range(Q.shape[1]):
                if not q_mask[i, t]:
                    continue
                valid = sim[t][d_mask[j]]
                total += valid.max().item() if valid.numel() else 0.0
            out[i, j] = total
    return out


def test_reference_matches_token_by_token_definition(rng):
    Q, D = randn((3, 5, 8), generator=rng), randn((4, 6, 8), generator=rng)
    qm, dm = rand_mask((3, 5), generator=rng), rand_mask((4, 6), generator=rng)
    dm[2] = False
    out = maxsim_reference(Q.double(), D.double(), qm, dm)
    assert_close(out, _naive(Q, D, qm, dm), dtype=torch.float64)
    assert torch.all(out[:, 2] == 0)


def test_argmax_sentinel_and_values(rng):
    Q, D = randn((2, 4, 8), generator=rng), randn((3, 5, 8), generator=rng)
    qm = torch.ones(2, 4, dtype=torch.bool)
    qm[0, 1] = False
    dm = torch.ones(3, 5, dtype=torch.bool)
    dm[1] = False
    dm[2, :3] = False
    _, arg = maxsim_reference(Q, D, qm, dm, return_argmax=True)
    assert arg.shape == (2, 3, 4)
    assert torch.all(arg[0, :, 1] == -1)  # masked query token
    assert torch.all(arg[:, 1] == -1)  # document without a valid token
    assert torch.all(arg[:, 2][qm] >= 3)  # masked document tokens never win
    sim = torch.einsum("qid,njd->qnij", Q, D)
    assert arg[1, 0, 2] == sim[1, 0, 2].argmax()


def test_chunked_equals_unchunked(rng, monkeypatch):
    Q, D = randn((5, 7, 16), generator=rng), randn((6, 9, 16), generator=rng)
    qm, dm = rand_mask((5, 7), generator=rng), rand_mask((6, 9), generator=rng)
    full, full_arg = maxsim_reference(Q, D, qm, dm, return_argmax=True)
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 7 * 9 * 2)  # 2 pairs per block
    small, small_arg = maxsim_reference(Q, D, qm, dm, return_argmax=True)
    assert_close(small, full) and torch.equal(full_arg, small_arg)
    D4 = randn((5, 3, 9, 16), generator=rng)
    a = maxsim_reference(Q, D4)
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 1 << 28)
    assert_close(a, maxsim_reference(Q, D4))


def test_pairs_and_varlen_references_agree(rng):
    Q, D = randn((3, 5, 8), generator=rng), randn((3, 7, 8), generator=rng)
    lq, ld = torch.tensor([5, 2, 4]), torch.tensor([7, 1, 3])
    qm = torch.arange(5)[None] < lq[:, None]
    dm = torch.arange(7)[None] < ld[:, None]
    padded = maxsim_pairs_reference(Q, D, qm, dm)
    cu_q = torch.cat([torch.zeros(1, dtype=torch.long), lq.cumsum(0)])
    cu_d = torch.cat([torch.zeros(1, dtype=torch.long), ld.cumsum(0)])
    Qp = torch.cat([Q[b, : lq[b]] for b in range(3)])
    Dp = torch.cat([D[b, : ld[b]] for b in range(3)])
    assert_close(maxsim_varlen_reference(Qp, Dp, cu_q, cu_d), padded)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_accumulates_in_fp32(rng, dtype):
    Q, D = randn((2, 4, 8), generator=rng, dtype=dtype), randn((2, 3, 8), generator=rng, dtype=dtype)
    assert maxsim_reference(Q, D).dtype == torch.float32


def test_normalize_gives_cosine(rng):
    Q, D = randn((2, 4, 8), generator=rng), randn((3, 5, 8), generator=rng)
    out = maxsim_reference(Q * 3, D * 0.5, normalize=True)
    assert torch.all(out <= 4 + 1e-5)
    assert_close(out, maxsim_reference(Q, D, normalize=True))
