"""The kernels (Triton interpreter on CPU, compiled on CUDA) against the float64 reference:
values and gradients, every layout and backward method."""

import pytest
import torch

from late_interaction_kernels import maxsim, maxsim_pairs
from late_interaction_kernels.ops.common.layout import ALL_PAIRS
from late_interaction_kernels.ops.maxsim import backward_plan, maxsim_varlen, plan
from late_interaction_kernels.ops.maxsim.plan import maxsim_forward_triton
from late_interaction_kernels.ops.maxsim.reference import (
    maxsim_pairs_reference,
    maxsim_reference,
    maxsim_varlen_reference,
)
from triton_dispatch.testing import assert_close, assert_gradients_match, rand_mask, randn

#: ``lowmem-csr``: ``lowmem`` with its dense kernel switched off (the CSR kernel, which in-batch
#: calls with many queries take), so both of its kernels run on the small shapes here
METHODS = ["unified", "lowmem", "lowmem-csr"]


def _method(monkeypatch, method: str) -> str:
    if method == "lowmem-csr":
        monkeypatch.setattr(backward_plan, "DENSE_MAX_QUERY_TOKENS", 0)
        return "lowmem"
    return method


# Triton's interpreter turns its one-element loop bounds into ints the way NumPy deprecates
pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)


def _inputs(rng, device, q_shape, d_shape, dtype=torch.float32):
    Q = randn(q_shape, generator=rng, dtype=dtype, device=device, requires_grad=True)
    D = randn(d_shape, generator=rng, dtype=dtype, device=device, requires_grad=True)
    return Q, D


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("masked", [False, True])
def test_all_pairs(rng, device, monkeypatch, method, masked):
    method = _method(monkeypatch, method)
    Q, D = _inputs(rng, device, (3, 20, 48), (4, 37, 48))
    qm = rand_mask((3, 20), generator=rng, device=device) if masked else None
    dm = rand_mask((4, 37), generator=rng, device=device) if masked else None
    assert_gradients_match(
        lambda q, d: maxsim(q, d, qm, dm, backward=method),
        lambda q, d: maxsim_reference(q, d, qm, dm),
        [Q, D],
        generator=rng,
        names=["Q", "D"],
    )


@pytest.mark.parametrize(
    ("lq", "dim", "masked", "normalize"),
    # lq 12 packs four queries per block (the fifth query fills a block alone), lq 40 one
    [(12, 32, True, False), (12, 48, False, True), (40, 32, True, False)],
)
def test_all_pairs_query_groups(rng, device, lq, dim, masked, normalize):
    nq = plan.MIN_GROUP_QUERIES + 1
    assert lq <= plan.MAX_GROUP_QUERY_LEN  # the query-group kernel runs
    Q, D = _inputs(rng, device, (nq, lq, dim), (3, 19, dim))
    qm = rand_mask((nq, lq), generator=rng, device=device) if masked else None
    dm = rand_mask((3, 19), generator=rng, device=device) if masked else None
    if masked:
        dm[1] = False  # a fully masked document scores 0, no gradient
    for method in ("unified", "lowmem"):
        Q.grad = D.grad = None
        assert_gradients_match(
            lambda q, d, m=method: maxsim(q, d, qm, dm, normalize=normalize, backward=m),
            lambda q, d: maxsim_reference(q, d, qm, dm, normalize=normalize),
            [Q, D],
            generator=rng,
            names=["Q", "D"],
        )
    with torch.no_grad():
        assert_close(
            maxsim(Q, D, qm, dm, normalize=normalize),
            maxsim_reference(Q.double(), D.double(), qm, dm, normalize=normalize),
            dtype=torch.float32,
        )


@pytest.mark.parametrize("method", [*METHODS, "auto"])
@pytest.mark.parametrize("masked", [False, True])
def test_grouped_4d(rng, device, monkeypatch, method, masked):
    method = _method(monkeypatch, method)
    Q, D = _inputs(rng, device, (2, 17, 32), (2, 3, 21, 32))
    qm = rand_mask((2, 17), generator=rng, device=device) if masked else None
    dm = rand_mask((2, 3, 21), generator=rng, device=device) if masked else None
    assert_gradients_match(
        lambda q, d: maxsim(q, d, qm, dm, backward=method),
        lambda q, d: maxsim_reference(q, d, qm, dm),
        [Q, D],
        generator=rng,
        names=["Q", "D"],
    )


@pytest.mark.parametrize("method", ["unified", "lowmem"])
@pytest.mark.parametrize("mask", [None, "1-d", "2-d"])
def test_one_query_against_documents(rng, device, monkeypatch, method, mask):
    """``Q (Lq, d)``, the usual inference call: scores ``(Nd,)`` and a gradient shaped like Q; its
    mask may be ``(Lq,)`` as 0.4.5 takes it, or ``(1, Lq)``."""
    Q, D = _inputs(rng, device, (13, 32), (4, 21, 32))
    qm = rand_mask((1, 13), generator=rng, device=device)
    given = {None: None, "1-d": qm[0], "2-d": qm}[mask]
    ref_mask = None if mask is None else qm
    out = maxsim(Q, D, given, backward=method)
    assert out.shape == (4,)
    assert_gradients_match(
        lambda q, d: maxsim(q, d, given, backward=method),
        lambda q, d: maxsim_reference(q[None], d, ref_mask)[0],
        [Q, D],
        generator=rng,
        names=["Q", "D"],
    )
    assert Q.grad.shape == Q.shape and D.grad.shape == D.shape


@pytest.mark.parametrize("q_rank", [2, 3])
def test_one_document(rng, device, q_rank):
    """``D (Ld, d)`` is one document, as 0.4.5 takes it: its axis is dropped from the scores (a
    0-dim score for one query against it); its mask may be ``(Ld,)``; gradients in the inputs'
    shapes."""
    q_shape = (13, 32) if q_rank == 2 else (3, 13, 32)
    Q, D = _inputs(rng, device, q_shape, (21, 32))
    dm = rand_mask((1, 21), generator=rng, device=device)
    out = maxsim(Q, D, None, dm[0])
    assert out.shape == (() if q_rank == 2 else (3,))
    assert_gradients_match(
        lambda q, d: maxsim(q, d, None, dm[0]),
        lambda q, d: maxsim_reference(q if q_rank == 3 else q[None], d[None], None, dm)[..., 0]
        .reshape(out.shape),
        [Q, D],
        generator=rng,
        names=["Q", "D"],
    )
    assert Q.grad.shape == Q.shape and D.grad.shape == D.shape


@pytest.mark.parametrize("method", METHODS)
def test_pairs(rng, device, monkeypatch, method):
    method = _method(monkeypatch, method)
    Q, D = _inputs(rng, device, (3, 9, 16), (3, 19, 16))
    qm = rand_mask((3, 9), generator=rng, device=device)
    dm = rand_mask((3, 19), generator=rng, device=device)
    assert_gradients_match(
        lambda q, d: maxsim_pairs(q, d, qm, dm, backward=method),
        lambda q, d: maxsim_pairs_reference(q, d, qm, dm),
        [Q, D],
        generator=rng,
        names=["Q", "D"],
    )


def _packed(rng, device, q_lens, d_lens, dim, dtype=torch.float32):
    Qp = randn((sum(q_lens), dim), generator=rng, dtype=dtype, device=device, requires_grad=True)
    Dp = randn((sum(d_lens), dim), generator=rng, dtype=dtype, device=device, requires_grad=True)
    cu = lambda lens: torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=device)
    return Qp, Dp, cu(q_lens).to(torch.int32), cu(d_lens)


@pytest.mark.parametrize("method", METHODS)
def test_varlen(rng, device, monkeypatch, method):
    method = _method(monkeypatch, method)
    Qp, Dp, cu_q, cu_d = _packed(rng, device, [5, 1, 12], [17, 3, 9], 48)
    assert_gradients_match(
        lambda q, d: maxsim_varlen(q, d, cu_q, cu_d, 12, 17, backward=method),
        lambda q, d: maxsim_varlen_reference(q, d, cu_q, cu_d),
        [Qp, Dp],
        generator=rng,
        names=["Q_packed", "D_packed"],
    )


def test_varlen_equals_padded(rng, device):
    q_lens, d_lens = [4, 7], [9, 2]
    Qp, Dp, cu_q, cu_d = _packed(rng, device, q_lens, d_lens, 16)
    Q = torch.zeros(2, 7, 16, device=device)
    D = torch.zeros(2, 9, 16, device=device)
    for b in range(2):
        Q[b, : q_lens[b]] = Qp[cu_q[b] : cu_q[b + 1]].detach()
        D[b, : d_lens[b]] = Dp[cu_d[b] : cu_d[b + 1]].detach()
    qm = torch.arange(7, device=device)[None] < torch.tensor(q_lens, device=device)[:, None]
    dm = torch.arange(9, device=device)[None] < torch.tensor(d_lens, device=device)[:, None]
    packed = maxsim_varlen(Qp, Dp, cu_q, cu_d)  # max_seqlen_q read from cu_seqlens_q
    assert_close(packed, maxsim_pairs(Q, D, qm, dm), tol=1e-6)


def test_fully_masked_document_scores_zero_with_zero_gradient(rng, device):
    Q, D = _inputs(rng, device, (2, 5, 16), (3, 8, 16))
    dm = torch.ones(3, 8, dtype=torch.bool, device=device)
    dm[1] = False
    out = maxsim(Q, D, None, dm)
    assert torch.all(out[:, 1] == 0) and torch.all(out[:, [0, 2]] != 0)
    out.sum().backward()
    assert torch.all(D.grad[1] == 0)
    assert_close(out, maxsim_reference(Q.double(), D.double(), None, dm))


@pytest.mark.parametrize("layout", ["all_pairs", "grouped"])
def test_lowmem_is_bitwise_deterministic_and_agrees_with_unified(rng, device, layout):
    # many query tokens collide on few document tokens: the case where summation order matters
    shape = (5, 3, 16) if layout == "all_pairs" else (4, 2, 3, 16)
    Q = randn((4, 24, 16), generator=rng, device=device, dtype=torch.float16)
    D = randn(shape, generator=rng, device=device, dtype=torch.float16)
    g = randn((4, shape[0] if layout == "all_pairs" else 2), generator=rng, device=device)
    grads = {}
    for method, runs in (("lowmem", 2), ("unified", 1)):
        for run in range(runs):
            q, d = Q.clone().requires_grad_(), D.clone().requires_grad_()
            maxsim(q, d, backward=method).backward(g)
            grads[method, run] = (q.grad, d.grad)
    assert torch.equal(grads["lowmem", 0][1], grads["lowmem", 1][1])
    assert torch.equal(grads["lowmem", 0][0], grads["lowmem", 1][0])
    assert_close(grads["unified", 0][1], grads["lowmem", 0][1], tol=2e-3)
    assert torch.equal(grads["unified", 0][0], grads["lowmem", 0][0])


@pytest.mark.parametrize("method", METHODS)
def test_long_queries_are_chunked_exactly(rng, device, monkeypatch, method):
    method = _method(monkeypatch, method)
    Q, D = _inputs(rng, device, (2, 40, 16), (3, 11, 16))
    qm = rand_mask((2, 40), generator=rng, device=device)
    whole = maxsim(Q.detach(), D.detach(), qm)
    monkeypatch.setattr(plan, "LONG_QUERY_THRESHOLD", 16)
    monkeypatch.setattr(plan, "QUERY_CHUNK", 16)
    assert plan.chunking(40) == (16, 3)
    assert_close(maxsim(Q.detach(), D.detach(), qm), whole, tol=1e-6)
    assert_gradients_match(
        lambda q, d: maxsim(q, d, qm, backward=method),
        lambda q, d: maxsim_reference(q, d, qm),
        [Q, D],
        generator=rng,
        names=["Q", "D"],
    )


def test_long_varlen_queries_are_chunked(rng, device, monkeypatch):
    monkeypatch.setattr(plan, "LONG_QUERY_THRESHOLD", 16)
    monkeypatch.setattr(plan, "QUERY_CHUNK", 16)
    Qp, Dp, cu_q, cu_d = _packed(rng, device, [35, 3], [6, 10], 16)
    assert_gradients_match(
        lambda q, d: maxsim_varlen(q, d, cu_q, cu_d, 35),
        lambda q, d: maxsim_varlen_reference(q, d, cu_q, cu_d),
        [Qp, Dp],
        generator=rng,
        names=["Q_packed", "D_packed"],
    )


@pytest.mark.parametrize("dim", [48, 96])
def test_non_power_of_two_dims(rng, device, dim):
    Q, D = _inputs(rng, device, (2, 13, dim), (3, 18, dim))
    assert_gradients_match(
        lambda q, d: maxsim(q, d, backward="lowmem"),
        maxsim_reference,
        [Q, D],
        generator=rng,
        names=["Q", "D"],
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("method", METHODS)
def test_half_precision(rng, device, dtype, monkeypatch, method):
    method = _method(monkeypatch, method)
    Q, D = _inputs(rng, device, (2, 16, 32), (3, 20, 32), dtype=dtype)
    assert_gradients_match(
        lambda q, d: maxsim(q, d, backward=method),
        maxsim_reference,
        [Q, D],
        generator=rng,
        names=["Q", "D"],
    )


@pytest.mark.parametrize("backend", [None, "torch"])
@pytest.mark.parametrize("method", METHODS)
def test_normalize(rng, device, monkeypatch, method, backend):
    method = _method(monkeypatch, method)
    Q, D = _inputs(rng, device, (2, 9, 48), (2, 3, 14, 48))
    with torch.no_grad():
        Q.mul_(5)
        D[0, 1, 3] = 0  # a zero token: cosine 0, finite gradient
    qm = rand_mask((2, 9), generator=rng, device=device)
    assert_gradients_match(
        lambda q, d: maxsim(q, d, qm, normalize=True, backward=method, backend=backend),
        lambda q, d: maxsim_reference(q, d, qm, normalize=True),
        [Q, D],
        generator=rng,
        names=["Q", "D"],
    )


def test_normalize_pairs_and_varlen(rng, device):
    Q, D = _inputs(rng, device, (2, 6, 16), (2, 11, 16), dtype=torch.float16)
    assert_gradients_match(
        lambda q, d: maxsim_pairs(q, d, normalize=True),
        lambda q, d: maxsim_pairs_reference(q, d, normalize=True),
        [Q, D],
        generator=rng,
        names=["Q", "D"],
    )
    Qp, Dp, cu_q, cu_d = _packed(rng, device, [3, 6], [8, 5], 16)
    assert_gradients_match(
        lambda q, d: maxsim_varlen(q, d, cu_q, cu_d, normalize=True, backward="lowmem"),
        lambda q, d: maxsim_varlen_reference(q, d, cu_q, cu_d, normalize=True),
        [Qp, Dp],
        generator=rng,
        names=["Q_packed", "D_packed"],
    )


def test_argmax_rows_follow_the_reference(rng, device):
    Q = randn((2, 6, 16), generator=rng, device=device)
    D = randn((3, 10, 16), generator=rng, device=device)
    qm = rand_mask((2, 6), generator=rng, device=device)
    dm = rand_mask((3, 10), generator=rng, device=device)
    dm[2] = False
    scores, argmax = maxsim_forward_triton(
        Q.reshape(12, 16), D.reshape(30, 16), qm, dm.reshape(3, 10), None, None,
        ALL_PAIRS, 2, 3, 6, 10, True,
    )  # fmt: skip
    ref_scores, local = maxsim_reference(Q, D, qm, dm, return_argmax=True)
    offsets = (torch.arange(3, device=device) * 10)[None, :, None]
    expected = torch.where(local >= 0, local + offsets, -1)
    assert torch.equal(argmax.long().view(2, 3, 6).cpu(), expected.cpu())
    assert_close(scores.view(2, 3), ref_scores)


def test_no_argmax_saved_without_gradients(rng, device):
    Q = randn((2, 6, 16), generator=rng, device=device)
    D = randn((3, 10, 16), generator=rng, device=device)
    scores, argmax = maxsim_forward_triton(
        Q.reshape(12, 16), D.reshape(30, 16), None, None, None, None,
        ALL_PAIRS, 2, 3, 6, 10, False,
    )  # fmt: skip
    assert argmax.numel() == 0
    assert_close(scores.view(2, 3), maxsim_reference(Q.double(), D.double()))


def test_nan_propagates_without_crashing(rng, device):
    Q, D = _inputs(rng, device, (2, 5, 16), (3, 8, 16))
    dm = torch.ones(3, 8, dtype=torch.bool, device=device)
    with torch.no_grad():
        Q[0, 2, 3] = float("nan")
        D[1, 4, 0] = float("nan")
        D[2, 7, 0] = float("nan")
    dm[2, 7] = False  # a NaN in a masked token is ignored
    out = maxsim(Q, D, None, dm)
    ref = maxsim_reference(Q.detach().double(), D.detach().double(), None, dm)
    assert torch.equal(torch.isnan(out.cpu()), torch.isnan(ref.cpu()))
    assert (
        torch.isnan(out[0]).all()
        and torch.isnan(out[1, 1])
        and not torch.isnan(out[1, [0, 2]]).any()
    )
    out.nansum().backward()  # never crashes


def test_torch_backend_matches_kernels(rng, device):
    Q, D = _inputs(rng, device, (2, 7, 16), (2, 3, 9, 16))
    a = maxsim(Q, D, backend="torch")
    a.sum().backward()
    ga = (Q.grad.clone(), D.grad.clone())
    Q.grad = D.grad = None
    b = maxsim(Q, D)
    b.sum().backward()
    assert_close(b, a)
    assert_close(Q.grad, ga[0]) and assert_close(D.grad, ga[1])


@pytest.mark.parametrize("backend", ["torch", None])
def test_every_layout_without_gradients(rng, device, backend):
    Q = randn((2, 6, 16), generator=rng, device=device)
    D3 = randn((3, 10, 16), generator=rng, device=device)
    D4 = randn((2, 3, 10, 16), generator=rng, device=device)
    Dp = randn((2, 10, 16), generator=rng, device=device)
    with torch.no_grad():
        assert_close(maxsim(Q, D3, backend=backend), maxsim_reference(Q.double(), D3.double()))
        assert_close(maxsim(Q, D4, backend=backend), maxsim_reference(Q.double(), D4.double()))
        assert_close(
            maxsim_pairs(Q, Dp, backend=backend), maxsim_pairs_reference(Q.double(), Dp.double())
        )
        cu_q = torch.tensor([0, 5, 12], device=device)
        cu_d = torch.tensor([0, 9, 20], device=device)
        Qp, Dpk = Q.reshape(12, 16), Dp.reshape(20, 16)
        assert_close(
            maxsim_varlen(Qp, Dpk, cu_q, cu_d, backend=backend),
            maxsim_varlen_reference(Qp.double(), Dpk.double(), cu_q, cu_d),
        )


@pytest.mark.parametrize(("per_split", "max_splits"), [(2, 8), (1, 2)])
def test_grad_q_splits_documents_over_programs(rng, device, monkeypatch, per_split, max_splits):
    monkeypatch.setattr(backward_plan, "DOCS_PER_SPLIT", per_split)
    monkeypatch.setattr(backward_plan, "MIN_DOCS_PER_SPLIT", per_split)
    monkeypatch.setattr(backward_plan, "MAX_DOC_SPLITS", max_splits)
    Q, D = _inputs(rng, device, (2, 7, 16), (5, 9, 16), dtype=torch.float16)
    dm = rand_mask((5, 9), generator=rng, device=device)
    assert_gradients_match(
        lambda q, d: maxsim(q, d, None, dm, normalize=True),
        lambda q, d: maxsim_reference(q, d, None, dm, normalize=True),
        [Q, D],
        generator=rng,
        names=["Q", "D"],
    )


@pytest.mark.parametrize("normalize", [False, True])
def test_dense_grad_d_spans_row_blocks_and_query_chunks(rng, device, monkeypatch, normalize):
    # lq 70 > one 64-token chunk, ld 40 > one row block: every loop of the dense kernel runs; the
    # sort of the CSR kernel must not (the dense kernel writes every row itself)
    monkeypatch.setattr(backward_plan, "invert_argmax", None)
    Q, D = _inputs(rng, device, (2, 70, 16), (2, 2, 40, 16))
    qm = rand_mask((2, 70), generator=rng, device=device)
    dm = rand_mask((2, 2, 40), generator=rng, device=device)
    dm[1, 0] = False  # a fully masked document: score 0, zero gradient
    assert_gradients_match(
        lambda q, d: maxsim(q, d, qm, dm, normalize=normalize),
        lambda q, d: maxsim_reference(q, d, qm, dm, normalize=normalize),
        [Q, D],
        generator=rng,
        names=["Q", "D"],
    )


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("grads", ["both", "Q", "D"])
def test_rerank_gradient_takes_the_dense_kernel(rng, device, monkeypatch, normalize, grads):
    # one query against many documents: auto → lowmem's dense kernel, grad_Q split over programs;
    # with both gradients the dense launch adds up the split grad_Q itself
    monkeypatch.setattr(backward_plan, "invert_argmax", None)
    monkeypatch.setattr(backward_plan, "DOCS_PER_SPLIT", 2)
    monkeypatch.setattr(backward_plan, "MIN_DOCS_PER_SPLIT", 2)
    monkeypatch.setattr(backward_plan, "FINISH_SPLIT_BLOCK", 2)  # several split blocks per row
    backward_plan.BACKWARD_PLANS.clear()
    Q, D = _inputs(rng, device, (1, 12, 16), (7, 9, 16), dtype=torch.float16)
    Q.requires_grad_(grads != "D")
    D.requires_grad_(grads != "Q")
    wrt = [t for t in (Q, D) if t.requires_grad]
    names = [n for n, t in (("Q", Q), ("D", D)) if t.requires_grad]

    def ours(*xs):
        q, d = (xs[0], D) if grads == "Q" else (Q, xs[0]) if grads == "D" else xs
        return maxsim(q, d, normalize=normalize)

    def ref(*xs):  # the fixed input in the reference's dtype
        fixed = (D if grads == "Q" else Q).detach().to(xs[0].dtype)
        q, d = (xs[0], fixed) if grads == "Q" else (fixed, xs[0]) if grads == "D" else xs
        return maxsim_reference(q, d, normalize=normalize)

    assert_gradients_match(ours, ref, wrt, generator=rng, names=names)
    (plan,) = backward_plan.BACKWARD_PLANS._plans.values()
    assert plan.dense and plan.n_split > 1
    assert plan.finish_q == (grads == "both")


def test_split_grad_q_of_many_rows_keeps_its_reduction(rng, device, monkeypatch):
    # above FINISH_MAX_QUERY_ROWS the split grad_Q is added up by its own reduction, not the dense
    # launch
    monkeypatch.setattr(backward_plan, "DOCS_PER_SPLIT", 2)
    monkeypatch.setattr(backward_plan, "MIN_DOCS_PER_SPLIT", 2)
    monkeypatch.setattr(backward_plan, "FINISH_MAX_QUERY_ROWS", 8)
    backward_plan.BACKWARD_PLANS.clear()
    Q, D = _inputs(rng, device, (1, 12, 16), (7, 9, 16), dtype=torch.float16)
    assert_gradients_match(maxsim, maxsim_reference, [Q, D], generator=rng, names=["Q", "D"])
    (plan,) = backward_plan.BACKWARD_PLANS._plans.values()
    assert plan.dense and plan.n_split > 1 and not plan.finish_q


def test_doc_splits_fill_the_grid():
    assert backward_plan.doc_splits(1000, 1, 528) == 125  # a rerank: runs of 8 documents
    assert backward_plan.doc_splits(256, 256, 528) == 8  # in-batch: runs of 32
    assert backward_plan.doc_splits(8, 128, 528) == 1  # hard negatives: one run per query
    assert backward_plan.doc_splits(0, 0, 528) == 1


def test_dense_grad_d_splits_long_documents_over_programs(rng, device, monkeypatch):
    # one pair of a 300-row document: the rows are split into runs of 128 over three programs
    monkeypatch.setattr(backward_plan, "invert_argmax", None)
    Q, D = _inputs(rng, device, (1, 9, 16), (1, 300, 16))
    dm = rand_mask((1, 300), generator=rng, device=device)
    assert_gradients_match(
        lambda q, d: maxsim_pairs(q, d, None, dm),
        lambda q, d: maxsim_pairs_reference(q, d, None, dm),
        [Q, D],
        generator=rng,
        names=["Q", "D"],
    )
