"""The fused top-k kernel and the FP8 kernel against their float64 references.

On CPU both kernels run in the Triton interpreter. It has no 8-bit floats, so there the FP8 kernel
runs fp16/fp32 stand-in operands: that checks its tiling, masks and scale handling, not the float8
``tl.dot`` itself, which the sm_90 compile test builds and the ``gpu`` tests run.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from late_interaction_kernels.fp8 import (
    dequantize_fp8_per_tensor,
    dequantize_fp8_per_token,
    maxsim_inference_fp8,
    quantize_fp8_per_tensor,
    quantize_fp8_per_token,
)
from late_interaction_kernels.ops.maxsim_fp8.reference import maxsim_fp8_reference
from late_interaction_kernels.ops.maxsim_topk.reference import maxsim_topk_reference
from late_interaction_kernels.topk import maxsim_topk
from triton_dispatch.backend import interpreter_enabled
from triton_dispatch.testing import assert_close

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim:DeprecationWarning"
)


@pytest.fixture(params=[True, False], ids=["tile-max", "row-max"])
def fp8_running_best(request, monkeypatch):
    """The FP8 kernel with each running best the autotuner may pick on a GPU: the tile-wide
    elementwise maximum (the interpreter's one config) and each tile's row maxima."""
    import triton

    from late_interaction_kernels.ops.maxsim_fp8.kernels import fp8_maxsim_kernel
    from triton_dispatch.launch import clear_plan_caches

    config = triton.Config({"BLOCK_D": 16, "TILE_MAX": request.param}, num_warps=4, num_stages=1)
    monkeypatch.setattr(fp8_maxsim_kernel, "configs", [config])
    clear_plan_caches()
    yield request.param
    clear_plan_caches()


def _collection(rng, nq, nd, lq, ld, dim, dtype=torch.float32, device="cpu"):
    Q = torch.randn(nq, lq, dim, generator=rng).to(device, dtype)
    D = torch.randn(nd, ld, dim, generator=rng).to(device, dtype)
    q_mask = (torch.rand(nq, lq, generator=rng) > 0.3).to(device)
    d_mask = (torch.rand(nd, ld, generator=rng) > 0.3).to(device)
    d_mask[1] = False  # a fully masked document scores 0
    return Q, D, q_mask, d_mask


def _check_topk(got, Q, D, k, q_mask, d_mask, normalize, largest, dtype=torch.float32):
    scores, idx = got
    want, _ = maxsim_topk_reference(
        Q.double().cpu(), D.double().cpu(), k, None if q_mask is None else q_mask.cpu(),
        None if d_mask is None else d_mask.cpu(), normalize=normalize, largest=largest,
    )  # fmt: skip
    assert idx.dtype == torch.int64 and scores.dtype == torch.float32
    assert_close(scores.cpu(), want, dtype=dtype, name="top-k scores")
    # ties may come in any order: the indices must be distinct and score what was returned
    full = maxsim_topk_reference(Q.double().cpu(), D.double().cpu(), D.shape[0],
                                 None if q_mask is None else q_mask.cpu(),
                                 None if d_mask is None else d_mask.cpu(),
                                 normalize=normalize)  # fmt: skip
    by_doc = torch.empty_like(full[0]).scatter_(1, full[1], full[0])
    assert_close(scores.cpu(), by_doc.gather(1, idx.cpu()), dtype=dtype, name="scores of indices")
    for row in idx:
        assert row.unique().numel() == row.numel()


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("masks", [False, True])
def test_fused_topk_matches_reference(largest, normalize, masks, rng):
    Q, D, q_mask, d_mask = _collection(rng, 2, 13, 5, 19, 24)
    if not masks:
        q_mask = d_mask = None
    got = maxsim_topk(Q, D, 4, q_mask, d_mask, normalize=normalize, largest=largest)
    _check_topk(got, Q, D, 4, q_mask, d_mask, normalize, largest)


@pytest.mark.parametrize(("nq", "lq", "ld"), [(5, 7, 32), (3, 20, 17)])
def test_fused_topk_with_several_queries(nq, lq, ld, rng, monkeypatch):
    # each query keeps its own running state beside the others (batches are the chunked path's
    # by default: opened to the kernel here)
    from late_interaction_kernels.ops.maxsim_topk import op

    monkeypatch.setattr(op, "FUSED_MAX_QUERIES", 64)
    Q, D, q_mask, d_mask = _collection(rng, nq, 11, lq, ld, 16)
    got = maxsim_topk(Q, D, 3, q_mask, d_mask)
    _check_topk(got, Q, D, 3, q_mask, d_mask, False, True)


def test_topk_ties_and_k_above_nd(rng):
    Q, D, _, _ = _collection(rng, 1, 5, 3, 4, 16)
    D[2] = D[0]  # equal scores
    D[4] = D[0]
    scores, idx = maxsim_topk(Q, D, 9)
    assert scores.shape == (1, 5)
    _check_topk((scores, idx), Q, D, 5, None, None, False, True)


@pytest.mark.parametrize("order", ["rising", "falling", "shuffled", "equal"])
@pytest.mark.parametrize("largest", [True, False])
def test_running_topk_through_many_windows(order, largest, rng, monkeypatch):
    """Small merge windows (16 offers, a ring of 4), so 96 documents (six windows) fill the ring
    and wrap it: rising scores offer every document (the worst order), equal scores tie everywhere (the
    earlier documents win), NaN scores rank as in ``torch.topk``."""
    from late_interaction_kernels.ops.maxsim_topk import op

    monkeypatch.setattr(op, "MIN_SORT", 32)
    monkeypatch.setattr(op, "FUSED_MAX_QUERIES", 64)
    nq, nd = 2, 96
    Q = torch.rand(nq, 3, 8, generator=rng) + 0.5
    level = {
        "rising": torch.arange(nd, dtype=torch.float32),
        "falling": -torch.arange(nd, dtype=torch.float32),
        "shuffled": torch.randperm(nd, generator=rng).float(),
        "equal": torch.zeros(nd),
    }[order]
    D = torch.randn(nd, 2, 8, generator=rng) * 0.01 + (1 + level / nd)[:, None, None]
    if order == "equal":
        D = D[:1].expand(nd, 2, 8).clone()
    if order == "shuffled":
        D[[17, 90]] = float("nan")
    want = maxsim_topk_reference(Q.double(), D.double(), 5, largest=largest)
    scores, idx = maxsim_topk(Q, D, 5, largest=largest)
    assert_close(scores, want.values, dtype=torch.float32, name="top-k scores")
    if order == "equal":
        assert torch.equal(idx, torch.arange(5).expand(nq, 5))
    elif order == "shuffled" and largest:
        assert set(idx[:, :2].flatten().tolist()) == {17, 90}
    else:
        assert torch.equal(idx, want.indices)


@pytest.mark.parametrize("backend", ["torch", None])
def test_topk_chunked_path_and_2d_query(backend, rng):
    Q, D, q_mask, d_mask = _collection(rng, 1, 9, 3, 6, 16)
    scores, idx = maxsim_topk(Q[0], D, 3, q_mask[0], d_mask, chunk_size=2, backend=backend)
    assert scores.shape == idx.shape == (3,)
    _check_topk((scores[None], idx[None]), Q, D, 3, q_mask, d_mask, False, True)


def test_long_queries_take_the_chunked_path(rng):
    Q, D, _, _ = _collection(rng, 1, 4, 130, 3, 16)
    _check_topk(maxsim_topk(Q, D, 2), Q, D, 2, None, None, False, True)


@pytest.mark.parametrize("per_token", [False, True])
def test_quantize_roundtrip(per_token, rng):
    X = torch.randn(3, 5, 16, generator=rng)
    quantize = quantize_fp8_per_token if per_token else quantize_fp8_per_tensor
    dequantize = dequantize_fp8_per_token if per_token else dequantize_fp8_per_tensor
    Xq, scale = quantize(X)
    assert Xq.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    assert scale.shape == ((3, 5) if per_token else ())
    back = dequantize(Xq, scale)
    assert (back - X).abs().max() <= 0.07 * X.abs().max()  # e4m3: 3 mantissa bits
    with pytest.raises(TypeError, match="8-bit float"):
        quantize(X, torch.float16)


@pytest.mark.parametrize("scales", ["tensor", "token", "mixed"])
def test_fp8_scores_from_dequantised_values(scales, rng):
    Q, D, q_mask, d_mask = _collection(rng, 2, 3, 4, 5, 16)
    Qq, sq = (quantize_fp8_per_token if scales != "tensor" else quantize_fp8_per_tensor)(Q)
    Dq, sd = (quantize_fp8_per_token if scales == "token" else quantize_fp8_per_tensor)(D)
    got = maxsim_inference_fp8(Qq, Dq, scale_Q=sq, scale_D=sd, q_mask=q_mask, d_mask=d_mask)
    want = maxsim_fp8_reference(Qq, Dq, sq, sd, q_mask, d_mask)
    assert_close(got, want, name="fp8 scores")


@pytest.mark.skipif(
    not interpreter_enabled(), reason="stand-in operands run only in the interpreter"
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("scales", ["tensor", "token", "mixed"])
def test_fp8_kernel_on_stand_in_operands(dtype, scales, rng, fp8_running_best):
    Q, D, q_mask, d_mask = _collection(rng, 2, 3, 20, 21, 40, dtype=dtype)
    sq = torch.rand(2, 20, generator=rng) + 0.5 if scales != "tensor" else torch.tensor(0.7)
    sd = torch.rand(3, 21, generator=rng) + 0.5 if scales == "token" else torch.tensor(1.3)
    got = maxsim_inference_fp8(
        Q, D, scale_Q=sq, scale_D=sd, q_mask=q_mask, d_mask=d_mask, backend="interpret"
    )
    assert_close(got, maxsim_fp8_reference(Q, D, sq, sd, q_mask, d_mask), dtype=dtype)


@pytest.mark.skipif(
    not interpreter_enabled(), reason="stand-in operands run only in the interpreter"
)
@pytest.mark.parametrize("scales", ["tensor", "token"])
@pytest.mark.parametrize(
    ("nq", "lq", "ld"),
    [(2, 20, 37), (3, 5, 37), (3, 5, 140)],
    ids=["two-query-blocks", "stacked-queries", "long-documents"],
)
def test_fp8_kernel_runs_of_documents(scales, nq, lq, ld, rng, fp8_running_best):
    # 7 documents over 3 programs (runs of 3, 3 and 1) with partial last tiles; a query of two
    # token blocks, 3 short queries stacked in one program (4 slots), documents past the flat loop
    Q, D, q_mask, d_mask = _collection(rng, nq, 7, lq, ld, 32, dtype=torch.float16)
    sq = torch.rand(nq, lq, generator=rng) + 0.5 if scales == "token" else torch.tensor(0.9)
    sd = torch.rand(7, ld, generator=rng) + 0.5 if scales == "token" else torch.tensor(1.1)
    got = maxsim_inference_fp8(
        Q, D, scale_Q=sq, scale_D=sd, q_mask=q_mask, d_mask=d_mask, backend="interpret"
    )
    assert_close(got, maxsim_fp8_reference(Q, D, sq, sd, q_mask, d_mask), dtype=torch.float16)


@pytest.mark.skipif(
    not interpreter_enabled(), reason="stand-in operands run only in the interpreter"
)
@pytest.mark.parametrize("scales", ["tensor", "token"])
@pytest.mark.parametrize("ld", [37, 140], ids=["flat", "long-documents"])
def test_fp8_kernel_without_masks_on_negative_similarities(scales, ld, rng, fp8_running_best):
    """Every similarity negative and no masks: the padding past each document's last token must
    score -inf, not the 0 of its zero rows (per-token scales fold that bound into one FMA)."""
    Q = torch.rand(3, 5, 32, generator=rng).half() + 0.1
    D = -(torch.rand(7, ld, 32, generator=rng).half() + 0.1)
    sq = torch.rand(3, 5, generator=rng) + 0.5 if scales == "token" else torch.tensor(0.9)
    sd = torch.rand(7, ld, generator=rng) + 0.5 if scales == "token" else torch.tensor(1.1)
    got = maxsim_inference_fp8(Q, D, scale_Q=sq, scale_D=sd, backend="interpret")
    want = maxsim_fp8_reference(Q, D, sq, sd)
    assert (want < 0).all()
    assert_close(got, want, dtype=torch.float16)


@pytest.mark.skipif(
    not interpreter_enabled(), reason="stand-in operands run only in the interpreter"
)
@pytest.mark.parametrize("scales", ["tensor", "token"])
@pytest.mark.parametrize(("nq", "lq", "ld"), [(2, 20, 37), (3, 5, 37)])
def test_fp8_tma_kernel_on_stand_in_operands(scales, nq, lq, ld, rng, monkeypatch):
    """The Hopper path (document tiles through a TMA descriptor), forced open under the
    interpreter: a tile that runs past its document reads the next one's rows (or zeros past the
    tensor), which the column mask must drop."""
    from late_interaction_kernels.ops.common import tma
    from late_interaction_kernels.ops.maxsim_fp8.op import uses_tma

    monkeypatch.setattr(tma, "tma_supported", lambda device: True)
    Q, D, q_mask, d_mask = _collection(rng, nq, 7, lq, ld, 32, dtype=torch.float16)
    # per-token query scales; the documents' scale is one number on this path
    sq = torch.rand(nq, lq, generator=rng) + 0.5 if scales == "token" else torch.tensor(0.9)
    sd = torch.tensor(1.1)
    assert uses_tma(Q, D, sd) and not uses_tma(Q, D, torch.ones(7, ld))
    got = maxsim_inference_fp8(
        Q, D, scale_Q=sq, scale_D=sd, q_mask=q_mask, d_mask=d_mask, backend="interpret"
    )
    assert_close(got, maxsim_fp8_reference(Q, D, sq, sd, q_mask, d_mask), dtype=torch.float16)
    got = maxsim_inference_fp8(Q, D, scale_Q=sq, scale_D=sd, backend="interpret")
    assert_close(got, maxsim_fp8_reference(Q, D, sq, sd), dtype=torch.float16)


@pytest.mark.skipif(
    not interpreter_enabled(), reason="stand-in operands run only in the interpreter"
)
# whole document tiles only, a partial last tile, and long documents (the nested loop, which
# checks a document's scales once instead of per tile)
@pytest.mark.parametrize("ld", [16, 37, 140])
@pytest.mark.parametrize("scales", ["tensor", "token"])
def test_fp8_kernel_invalid_scales_give_nan(scales, ld, rng, fp8_running_best):
    Q, D, q_mask, d_mask = _collection(rng, 2, 4, 5, ld, 32, dtype=torch.float32)
    # live tokens hold the bad scales (document 1 is masked whole), and a masked one in document 3
    q_mask[:, :2], d_mask[2, ld - 1], d_mask[0, 3], d_mask[3, 4] = True, True, True, False
    if scales == "token":
        sq, sd = torch.rand(2, 5, generator=rng) + 0.5, torch.rand(4, ld, generator=rng) + 0.5
        sq[0, 1], sd[1, 2], sd[2, ld - 1] = -0.5, float("inf"), float("nan")
        sd[0, 3], sd[3, 4] = -0.25, float("inf")  # a negative scale would give finite scores
    else:
        sq, sd = torch.tensor(-0.7), torch.tensor(1.3)
    for masks in ((q_mask, d_mask), (None, None)):
        got = maxsim_inference_fp8(
            Q, D, scale_Q=sq, scale_D=sd, q_mask=masks[0], d_mask=masks[1], backend="interpret"
        )
        want = maxsim_fp8_reference(Q, D, sq, sd, *masks)
        assert want.isnan().any()
        # NaN exactly where the reference has it: a masked token's scale takes no part
        assert torch.equal(got.isnan(), want.isnan())
        finite = ~want.isnan()
        assert_close(got[finite], want[finite], dtype=torch.float32)


def test_fp8_invalid_scales_read_as_nan_on_the_host(rng):
    Q, D, _, _ = _collection(rng, 2, 3, 4, 5, 16)
    Qq, sq = quantize_fp8_per_token(Q)
    Dq, sd = quantize_fp8_per_tensor(D)
    sq[1, 0] = -sq[1, 0]
    got = maxsim_inference_fp8(Qq, Dq, scale_Q=sq, scale_D=sd)
    assert got[1].isnan().all() and got[0].isfinite().all()
    assert (
        maxsim_inference_fp8(Qq, Dq, scale_Q=sq, scale_D=torch.tensor(float("inf"))).isnan().all()
    )


def test_fp8_bad_inputs(rng):
    Q = torch.randn(2, 3, 8, generator=rng).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="scale_Q must be"):
        maxsim_inference_fp8(Q, Q, scale_Q=torch.ones(3), scale_D=torch.tensor(1.0))
    with pytest.raises(ValueError, match="embedding dim"):
        maxsim_inference_fp8(Q, Q[..., :4], scale_Q=torch.tensor(1.0), scale_D=torch.tensor(1.0))


@pytest.mark.parametrize("backend", ["torch", None])
def test_topk_and_fp8_trace_under_compile(backend, rng):
    """Both declared custom ops trace into torch.compile(fullgraph=True) (fakes included)."""
    torch._dynamo.reset()
    Q, D, q_mask, d_mask = _collection(rng, 2, 13, 5, 19, 24)
    topk = torch.compile(
        lambda q, d: maxsim_topk(q, d, 4, q_mask, d_mask, backend=backend),
        fullgraph=True, backend="aot_eager",
    )  # fmt: skip
    _check_topk(topk(Q, D), Q, D, 4, q_mask, d_mask, False, True)
    sq, sd = torch.rand(2, 5, generator=rng) + 0.5, torch.tensor(1.3)
    fp8 = torch.compile(
        lambda q, d: maxsim_inference_fp8(
            q, d, scale_Q=sq, scale_D=sd, q_mask=q_mask, d_mask=d_mask, backend=backend
        ),
        fullgraph=True, backend="aot_eager",
    )  # fmt: skip
    assert_close(fp8(Q, D), maxsim_fp8_reference(Q, D, sq, sd, q_mask, d_mask))


def test_kernels_compile_for_sm90(compile_on_hopper):
    compile_on_hopper(
        """
import sys
sys.path.insert(0, {tests!r})
from compile_for_hopper import compile_one
from late_interaction_kernels.ops.maxsim_topk.kernels import topk_kernel
from late_interaction_kernels.ops.maxsim_fp8.kernels import fp8_maxsim_kernel, fp8_maxsim_tma_kernel
topk = {{"Q": "*bf16", "D": "*bf16", "QM": "*u8", "DM": "*u8", "STATE": "*i64",
        "LISTS": "*i64", "OUT_SCORE": "*fp32", "OUT_INDEX": "*i64", "nq": "i32", "lq": "i32",
        "ld": "i32", "dim": "i32", "nd": "i32", "k": "i32"}}
for norm, largest, queries, block_d, tile_max in ((True, True, 1, 64, True),
                                                  (False, False, 4, 128, False)):
    compile_one(topk_kernel, topk, dict(HAS_QM=True, HAS_DM=True, NORMALIZE=norm,
                LARGEST=largest, UPCAST=False, IEEE=False, NORM_EPS=1e-12, EVEN_K=True,
                DYNAMIC_BOUNDS=True, BLOCK_Q=32 * queries, BLOCK_K=128, K_PAD=128,
                WINDOW=384, SORT=512, STATE_WORDS=16, LIST_WORDS=128 + 4 * 384,
                BLOCK_D=block_d, TILE_MAX=tile_max))
fp8 = {{"Q": "*fp8e4nv", "D": "*fp8e4nv", "SQ": "*fp32", "SD": "*fp32", "QM": "*u8",
       "DM": "*u8", "OUT": "*fp32", "nq": "i32", "nd": "i32", "lq": "i32", "ld": "i32",
       "dim": "i32", "docs_per_prog": "i32"}}
for per_token, masks in ((True, True), (True, False), (False, False)):
    for flat in (True, False):
        for tile_max in ((True,) if flat and per_token else (True, False)):
            compile_one(fp8_maxsim_kernel, fp8, dict(Q_PER_TOKEN=per_token,
                        D_PER_TOKEN=per_token, HAS_QM=masks, HAS_DM=masks, IEEE=False,
                        FLAT=flat, QUERIES=1 if per_token else 4, TRANS=flat and per_token,
                        TILE_MAX=tile_max, BLOCK_Q=128 if per_token else 32,
                        BLOCK_D=64 if per_token else 128, BLOCK_K=128))
    tma = dict(fp8, DDESC="tensordesc<fp8e4nv[64,128]>")
    compile_one(fp8_maxsim_tma_kernel, tma, dict(Q_PER_TOKEN=per_token, D_PER_TOKEN=per_token,
                HAS_QM=masks, HAS_DM=masks, IEEE=False, FLAT=True,
                QUERIES=1 if per_token else 4, BLOCK_Q=32, BLOCK_D=64, BLOCK_K=128))
"""
    )


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("nq", "nd", "lq", "ld", "k"),
    [(1, 5000, 32, 300, 100), (3, 700, 20, 77, 10), (16, 2000, 32, 300, 50), (5, 900, 100, 64, 7)],
)
def test_topk_gpu_bf16(nq, nd, lq, ld, k, rng):
    Q, D, q_mask, d_mask = _collection(rng, nq, nd, lq, ld, 128, torch.bfloat16, "cuda")
    got = maxsim_topk(Q, D, k, q_mask, d_mask, normalize=True)
    _check_topk(got, Q, D, k, q_mask, d_mask, True, True, dtype=torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("order", ["rising", "shuffled", "equal"])
@pytest.mark.parametrize(("nq", "k"), [(1, 100), (2, 1000)])
def test_topk_gpu_running_state_under_load(order, nq, k, rng):
    """Thousands of programs offering at once, on the real GPU: rising scores offer every
    document (every window is merged under the lock while others wait for their slot), equal
    scores tie everywhere; repeated calls must agree with ``maxsim`` + ``torch.topk`` exactly."""
    from late_interaction_kernels import maxsim

    nd = 30000
    Q = torch.rand(nq, 16, 64, generator=rng).to("cuda", torch.bfloat16)
    level = {
        "rising": torch.arange(nd, dtype=torch.float32),
        "shuffled": torch.randperm(nd, generator=rng).float(),
        "equal": torch.zeros(nd),
    }[order]
    D = torch.rand(nd, 24, 64, generator=rng) * 0.01 + (1 + level / nd)[:, None, None]
    D = D.to("cuda", torch.bfloat16)
    if order == "equal":
        D = D[:1].expand(nd, 24, 64).contiguous()
    want = maxsim(Q, D).topk(k, dim=1)
    for _ in range(3):
        scores, idx = maxsim_topk(Q, D, k)
        torch.testing.assert_close(scores, want.values, rtol=1e-5, atol=1e-5)
        if order == "equal":
            assert torch.equal(idx.cpu(), torch.arange(k).expand(nq, k))
        else:
            assert torch.equal(scores.cpu(), maxsim(Q, D).gather(1, idx).cpu())
            assert all(row.unique().numel() == k for row in idx)


@pytest.mark.gpu
@pytest.mark.parametrize("scales", ["tensor", "token"])
def test_fp8_gpu(scales, rng):
    if torch.cuda.get_device_capability() < (8, 9):
        with pytest.raises(RuntimeError, match="compute capability"):
            x = torch.zeros(1, 2, 32, device="cuda", dtype=torch.float8_e4m3fn)
            maxsim_inference_fp8(x, x, scale_Q=torch.tensor(1.0), scale_D=torch.tensor(1.0))
        return
    # short queries, queries of two 128-token blocks (partial scores summed afterwards), a batch
    # of short queries stacked per program, long documents (the nested loop)
    for nq, nd, lq, ld in (
        (2, 300, 32, 100),
        (3, 2000, 200, 77),
        (16, 500, 32, 300),
        (2, 200, 32, 1024),
        (2, 100, 32, 1100),
    ):
        Q, D, q_mask, d_mask = _collection(rng, nq, nd, lq, ld, 128, device="cuda")
        Q, D = F.normalize(Q, dim=-1), F.normalize(D, dim=-1)
        quantize = quantize_fp8_per_token if scales == "token" else quantize_fp8_per_tensor
        (Qq, sq), (Dq, sd) = quantize(Q), quantize(D)
        want = maxsim_fp8_reference(
            Qq.cpu(), Dq.cpu(), sq.cpu(), sd.cpu(), q_mask.cpu(), d_mask.cpu()
        )
        for masks in ((q_mask, d_mask), (None, None)):
            if masks[0] is None:
                want = maxsim_fp8_reference(Qq.cpu(), Dq.cpu(), sq.cpu(), sd.cpu())
            for _ in range(2):  # the first call builds the launch plan, the second replays it
                got = maxsim_inference_fp8(
                    Qq, Dq, scale_Q=sq, scale_D=sd, q_mask=masks[0], d_mask=masks[1]
                )
                assert_close(got.cpu(), want, tol=1e-4, name="fp8 kernel vs dequantised float64")
