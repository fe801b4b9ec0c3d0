"""PLAID scoring on the 0.4.5 index layout against its float64 reference."""

from __future__ import annotations

import pytest
import torch

from late_interaction_kernels.plaid import (
    maxsim_residual,
    maxsim_residual_reference,
    maxsim_residual_varlen,
    plaid_approx_score,
    plaid_approx_score_reference,
)
from triton_dispatch.testing import assert_close, assert_gradients_match

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)


def _index(rng, nbits, nd=4, max_ld=6, dim=16, n_centroids=7):
    codes = torch.randint(0, n_centroids, (nd, max_ld), generator=rng)
    residuals = torch.randint(0, 256, (nd, max_ld, dim * nbits // 8), generator=rng).to(torch.uint8)
    lengths = torch.randint(1, max_ld + 1, (nd,), generator=rng)
    centroids = torch.randn(n_centroids, dim, generator=rng)
    weights = torch.randn(1 << nbits, generator=rng) * 0.1
    return codes, residuals, lengths, centroids, weights


@pytest.mark.parametrize("nbits", [2, 4, 8])
@pytest.mark.parametrize("normalize", [True, False])
def test_padded_scores_and_query_gradient(nbits, normalize, rng):
    codes, residuals, lengths, centroids, weights = _index(rng, nbits)
    Q = torch.randn(2, 3, 16, generator=rng, requires_grad=True)
    assert_gradients_match(
        lambda q: maxsim_residual(q, codes, residuals, lengths, centroids, weights, nbits,
                                  normalize=normalize),
        lambda q: maxsim_residual_reference(q, codes, residuals, lengths, centroids, weights,
                                            nbits, normalize=normalize),
        [Q], generator=rng, names=["Q"],
    )  # fmt: skip


@pytest.mark.parametrize("normalize", [True, False])
def test_ragged_layout_matches_padded(normalize, rng):
    codes, residuals, lengths, centroids, weights = _index(rng, 4)
    lengths[2] = 0
    lengths[3] = codes.shape[1]  # a document longer than the max_seqlen_d=1 refused below
    mask = torch.arange(codes.shape[1]) < lengths[:, None]
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(torch.int32)
    Q = torch.randn(3, 16, generator=rng)  # one 2-D query
    got = maxsim_residual_varlen(Q, codes[mask], residuals[mask], cu, centroids, weights, 4,
                                 normalize=normalize)  # fmt: skip
    want = maxsim_residual_reference(Q.double(), codes, residuals, lengths, centroids, weights, 4,
                                     normalize=normalize)  # fmt: skip
    assert got.shape == (4,)
    assert_close(got, want)
    with pytest.raises(ValueError, match="max_seqlen_d"):
        maxsim_residual_varlen(Q, codes[mask], residuals[mask], cu, centroids, weights, 4,
                               max_seqlen_d=1)  # fmt: skip


@pytest.mark.parametrize("backend", [None, "torch"])
@pytest.mark.parametrize("ragged", [False, True])
def test_empty_document_passes_zero_gradient_without_normalize(backend, ragged, rng):
    """With ``normalize=False`` an empty document's score is the constant 0: the gradient through
    it is exactly zero (no raise), and the other documents' gradients are the reference's.
    (``normalize=True`` runs the fused kernel, which refuses it, as 0.4.5 does.)"""
    codes, residuals, lengths, centroids, weights = _index(rng, 4)
    lengths[1] = 0
    mask = torch.arange(codes.shape[1]) < lengths[:, None]
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(torch.int32)

    def score(q, c):
        if ragged:
            return maxsim_residual_varlen(q, codes[mask], residuals[mask], cu, c, weights, 4,
                                          normalize=False, backend=backend)  # fmt: skip
        return maxsim_residual(q, codes, residuals, lengths, c, weights, 4, normalize=False,
                               backend=backend)  # fmt: skip

    Q = torch.randn(2, 3, 16, generator=rng, requires_grad=True)
    C = centroids.clone().requires_grad_()
    out = score(Q, C)
    assert torch.equal(out[:, 1], torch.zeros(2))
    out[:, 1].sum().backward()
    assert torch.equal(Q.grad, torch.zeros_like(Q)) and torch.equal(C.grad, torch.zeros_like(C))
    Q.grad = C.grad = None
    assert_gradients_match(
        score,
        lambda q, c: maxsim_residual_reference(q, codes, residuals, lengths, c, weights, 4,
                                               normalize=False),
        [Q, C], generator=rng, names=["Q", "centroids"],
    )  # fmt: skip
    with pytest.raises(ValueError, match="zero-length document"):
        maxsim_residual(Q, codes, residuals, lengths, centroids, weights, 4, backend=backend)


def test_wrappers_read_the_collection_values_once(rng, monkeypatch):
    """The wrappers check codes and lengths under their own names; for inference the fused op
    must not read the same values back again (one more host synchronisation). With gradients it
    still does (its zero-length-document rule)."""
    from late_interaction_kernels.ops.maxsim_residual import dispatch as op

    reads = []
    check = op.check_values
    monkeypatch.setattr(op, "check_values", lambda *a: reads.append(1) or check(*a))
    codes, residuals, lengths, centroids, weights = _index(rng, 4)
    Q = torch.randn(2, 3, 16, generator=rng)
    mask = torch.arange(codes.shape[1]) < lengths[:, None]
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    want = maxsim_residual_reference(Q.double(), codes, residuals, lengths, centroids, weights, 4)
    assert_close(maxsim_residual(Q, codes, residuals, lengths, centroids, weights, 4), want)
    assert_close(
        maxsim_residual_varlen(Q, codes[mask], residuals[mask], cu, centroids, weights, 4), want
    )
    assert reads == []
    maxsim_residual(Q.requires_grad_(), codes, residuals, lengths, centroids, weights, 4)
    assert reads == [1]


def test_approx_score(rng):
    codes, _, lengths, _, _ = _index(rng, 2, nd=5)
    lengths[0] = 0
    qcs = torch.randn(7, 3, generator=rng)
    assert_close(plaid_approx_score(qcs, codes, lengths),
                 plaid_approx_score_reference(qcs.double(), codes, lengths))  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("lq", [3, 150])  # 150: two query tiles of the kernel
def test_approx_score_kernel_edge_values(dtype, lq, rng, device):
    """Long documents (several code tiles), lengths past the width and below 0, codes out of range,
    NaN and inf in the centroid scores: the kernel keeps the reference's rules for all of them."""
    n_centroids, batch, width = 9, 7, 70
    qcs = torch.randn(n_centroids, lq, generator=rng).to(dtype)
    qcs[3, 0] = float("nan")
    qcs[4, 1] = float("inf")
    qcs[5, 2] = float("-inf")
    codes = torch.randint(-2, n_centroids + 2, (batch, width), generator=rng)
    codes[1, :4] = torch.tensor([3, 4, 5, 0])  # NaN, +inf and -inf inside the length
    lengths = torch.randint(0, width + 1, (batch,), generator=rng)
    lengths[0], lengths[1], lengths[2], lengths[3] = 0, 4, width + 5, -3
    kernel = plaid_approx_score(qcs.to(device), codes.to(device), lengths.to(device)).cpu()
    torch_path = plaid_approx_score(qcs, codes, lengths, backend="torch")
    ref_codes = torch.where((codes >= 0) & (codes < n_centroids), codes, 0)
    want = plaid_approx_score_reference(qcs.double(), ref_codes, lengths)
    assert kernel.dtype == torch.float32 and torch.isfinite(kernel).all()
    assert_close(kernel, want, dtype=dtype)
    assert_close(torch_path, want, dtype=dtype)
    assert kernel[0] == 0 and kernel[3] == 0  # no codes count


@pytest.mark.parametrize("backend", ["torch", None])
def test_approx_score_traces_under_compile(backend, rng):
    torch._dynamo.reset()
    codes, _, lengths, _, _ = _index(rng, 2, nd=5)
    qcs = torch.randn(7, 3, generator=rng)
    score = torch.compile(
        lambda q, c, n: plaid_approx_score(q, c, n, backend=backend),
        fullgraph=True, backend="aot_eager",
    )  # fmt: skip
    assert_close(
        score(qcs, codes, lengths), plaid_approx_score_reference(qcs.double(), codes, lengths)
    )


def test_approx_score_kernel_compiles_for_sm90(compile_on_hopper):
    compile_on_hopper(
        """
import sys
sys.path.insert(0, {tests!r})
from compile_for_hopper import compile_one
from late_interaction_kernels.ops.plaid.kernels import plaid_approx_score_kernel
sig = {{"QCS": "*fp32", "CODES": "*i64", "LENGTHS": "*i64", "OUT": "*fp32", "n_centroids": "i32",
        "lq": "i32", "max_ld": "i32", "stride_c": "i32", "stride_b": "i32"}}
for bq in (32, 128):
    compile_one(plaid_approx_score_kernel, sig, dict(BLOCK_L=64, BLOCK_Q=bq))
"""
    )


def test_bad_inputs(rng):
    codes, residuals, lengths, centroids, weights = _index(rng, 2)
    Q = torch.randn(1, 3, 16, generator=rng)
    with pytest.raises(ValueError, match="nbits must be 2, 4, or 8"):
        maxsim_residual(Q, codes, residuals, lengths, centroids, weights, 1)
    with pytest.raises(ValueError, match="residuals last dim"):
        maxsim_residual(Q, codes, residuals[..., :2], lengths, centroids, weights, 2)
