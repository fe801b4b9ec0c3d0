"""``maxsim_across_ranks`` in real process groups (gloo, interpreted kernels) against one process
scoring the concatenated batch with the float64 reference: scores, and the gradients of every
rank's queries and documents under the sum of the ranks' cross-entropy losses.

Every rank builds the whole global batch from one seed, so each can compute the one-process
answer itself and return only its errors; the parent asserts on them.
"""

import pytest
import torch
import torch.nn.functional as F

from late_interaction_kernels import maxsim, maxsim_across_ranks
from late_interaction_kernels.ops.maxsim.reference import maxsim_reference
from triton_dispatch.testing import RankFailed, run_ranks

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)

DIM = 8
#: per rank: queries, query length, documents, document length, has q_mask, has d_mask
UNEVEN = [(2, 3, 2, 5, True, True), (0, 4, 3, 3, False, False), (3, 2, 1, 6, False, True)]
EVEN = [(2, 3, 2, 4, False, False)] * 3
TOL = 1e-4


def _batch(spec, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    ranks = []
    for nq, lq, nd, ld, qm, dm in spec:
        Q = torch.randn(nq, lq, DIM, generator=g).to(dtype)
        D = torch.randn(nd, ld, DIM, generator=g).to(dtype)
        q_mask = torch.rand(nq, lq, generator=g) > 0.3 if qm else None
        d_mask = torch.rand(nd, ld, generator=g) > 0.3 if dm else None
        if d_mask is not None:
            d_mask[:, 0] = True
        ranks.append((Q, D, q_mask, d_mask))
    return ranks


def _targets(nq: int, offset: int, total: int) -> torch.Tensor:
    return (torch.arange(nq) + offset) % total


def _one_process(batch, normalize):
    """Scores of every rank's queries, and the gradients of all queries and documents, in float64
    on the concatenated batch (documents padded to one length, the padding masked)."""
    ld = max(D.shape[1] for _, D, _, _ in batch)
    docs, masks = [], []
    for _, D, _, d_mask in batch:
        pad = ld - D.shape[1]
        docs.append(F.pad(D.double(), (0, 0, 0, pad)))
        m = torch.ones(D.shape[:2], dtype=torch.bool) if d_mask is None else d_mask
        masks.append(F.pad(m, (0, pad), value=False))
    D_all = torch.cat(docs).requires_grad_()
    mask_all = torch.cat(masks)
    total, offset, loss, scores, qs = D_all.shape[0], 0, 0.0, [], []
    for Q, D, q_mask, _ in batch:
        q = Q.double().requires_grad_()
        s = maxsim_reference(q, D_all, q_mask, mask_all, normalize=normalize)
        loss = loss + F.cross_entropy(s, _targets(Q.shape[0], offset, total), reduction="sum")
        scores.append(s.detach())
        qs.append(q)
        offset += D.shape[0]
    loss.backward()
    # a rank without queries has no rows in the loss: its query gradient is empty
    grads_q = [torch.zeros_like(q) if q.grad is None else q.grad for q in qs]
    grads_d, start = [], 0
    for _, D, _, _ in batch:
        grads_d.append(D_all.grad[start : start + D.shape[0], : D.shape[1]])
        start += D.shape[0]
    return scores, grads_q, grads_d


def _rel(a: torch.Tensor | None, b: torch.Tensor) -> float:
    if a is None or a.shape != b.shape:
        return float("inf")
    if b.numel() == 0:
        return 0.0
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-6))


def _errors_of(rank, batch, normalize, dtype, **kwargs):
    Q, D, q_mask, d_mask = batch[rank]
    Q = Q.clone().requires_grad_()
    D = D.clone().requires_grad_()
    scores, offset = maxsim_across_ranks(
        Q, D, q_mask, d_mask, normalize=normalize, return_offset=True, **kwargs
    )
    total = sum(b[1].shape[0] for b in batch)
    loss = F.cross_entropy(scores, _targets(Q.shape[0], offset, total), reduction="sum")
    loss.backward()
    ref_scores, ref_q, ref_d = _one_process(batch, normalize)
    return {
        "offset": offset,
        "dtype": str(scores.dtype),
        "scores": _rel(scores, ref_scores[rank]),
        "grad_Q": _rel(Q.grad, ref_q[rank]),
        "grad_D": _rel(D.grad, ref_d[rank]),
    }


def _raised(fn) -> str:
    try:
        fn()
    except (TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "nothing raised"


def _worker(rank, world_size):
    out = {}
    uneven = _batch(UNEVEN, torch.float32, seed=1)
    out["uneven"] = _errors_of(rank, uneven, True, torch.float32)
    out["uneven_lowmem"] = _errors_of(rank, uneven, True, torch.float32, backward="lowmem")

    # inference: no graph, no backward collective, the same scores
    Q, D, q_mask, d_mask = uneven[rank]
    with torch.no_grad():
        out["no_grad_scores"] = maxsim_across_ranks(Q, D, q_mask, d_mask)
    out["no_grad_ref"] = _one_process(uneven, True)[0][rank].float()

    even = _batch(EVEN, torch.float16, seed=2)
    out["even_fp16"] = _errors_of(rank, even, False, torch.float16)
    # every rank passes the same shapes: no size exchange, the same results
    out["even_uniform"] = _errors_of(rank, even, False, torch.float16, uniform=True)

    # the same gradients as gathering with torch.distributed.nn.all_gather, as PyLate and
    # sentence-transformers do, and scoring the gathered documents
    import torch.distributed.nn as dist_nn

    Q, D, _, _ = _batch(EVEN, torch.float32, seed=3)[rank]
    grads = []
    for route in ("ours", "all_gather_with_grad"):
        q, d = Q.clone().requires_grad_(), D.clone().requires_grad_()
        if route == "ours":
            s = maxsim_across_ranks(q, d, normalize=False)
        else:
            s = maxsim(q, torch.cat(dist_nn.all_gather(d)), normalize=False)
        F.cross_entropy(s, _targets(q.shape[0], rank * d.shape[0], s.shape[1])).backward()
        grads.append((s.detach(), q.grad, d.grad))
    out["vs_all_gather"] = [_rel(a, b) for a, b in zip(*grads, strict=True)]

    # only D requires grad here (a frozen query tower)
    d = D.clone().requires_grad_()
    maxsim_across_ranks(Q, d).sum().backward()
    out["frozen_q_grad_D"] = tuple(d.grad.shape)

    # bad arguments on one rank raise on every rank instead of leaving the others waiting
    bad_D = D[0] if rank == 2 else D
    out["bad_rank"] = _raised(lambda: maxsim_across_ranks(Q, bad_D))
    wide = torch.randn(D.shape[0], D.shape[1], DIM * 2) if rank == 1 else D
    wide_q = torch.randn(Q.shape[0], Q.shape[1], DIM * 2) if rank == 1 else Q
    out["bad_dim"] = _raised(lambda: maxsim_across_ranks(wide_q, wide))
    return out


def test_across_ranks_equals_one_process_on_the_concatenated_batch():
    results = run_ranks(_worker, 3)
    for rank, out in enumerate(results):
        for case in ("uneven", "uneven_lowmem", "even_fp16", "even_uniform"):
            errors = out[case]
            assert errors["dtype"] == "torch.float32"
            tol = 2e-3 if case.startswith("even") else TOL
            for key in ("scores", "grad_Q", "grad_D"):
                assert errors[key] < tol, (rank, case, key, errors)
        assert out["uneven"]["offset"] == [0, 2, 5][rank]
        assert out["even_fp16"]["offset"] == out["even_uniform"]["offset"] == 2 * rank
        torch.testing.assert_close(out["no_grad_scores"], out["no_grad_ref"], rtol=TOL, atol=TOL)
        assert max(out["vs_all_gather"]) < 1e-5, (rank, out["vs_all_gather"])
        assert out["frozen_q_grad_D"] == (2, 4, DIM)
        if rank == 2:
            assert out["bad_rank"].startswith("ValueError: maxsim_across_ranks: D must be")
        else:
            assert "rank(s) [2]" in out["bad_rank"], out["bad_rank"]
        assert out["bad_dim"].startswith("ValueError") and "embedding size" in out["bad_dim"]


def _raising_worker(rank, world_size):
    Q = torch.randn(2, 3, DIM)
    D = torch.randn(2, 4, DIM, requires_grad=True)
    scores = maxsim_across_ranks(Q, D)
    if rank == 1:
        raise RuntimeError("rank 1 fails between forward and backward")
    scores.sum().backward()  # rank 0 waits in the reduce-scatter until it is stopped
    return D.grad


def test_a_rank_that_raises_is_reported():
    with pytest.raises(RankFailed, match="rank 1 fails between forward and backward"):
        run_ranks(_raising_worker, 2, timeout=60.0)


def test_one_process_without_a_process_group_is_maxsim():
    g = torch.Generator().manual_seed(0)
    Q = torch.randn(2, 3, DIM, generator=g)
    D = torch.randn(3, 4, DIM, generator=g)
    scores, offset = maxsim_across_ranks(Q, D, return_offset=True)
    assert offset == 0
    torch.testing.assert_close(scores, maxsim(Q, D, normalize=True))
    with pytest.raises(ValueError, match="D must be"):
        maxsim_across_ranks(Q, D[0])
