"""Bad and degenerate inputs: a clear error naming the argument, or a well-defined answer."""

import pytest
import torch

from late_interaction_kernels import maxsim, maxsim_pairs
from late_interaction_kernels.ops.maxsim import maxsim_varlen, resolve_backward
from late_interaction_kernels.ops.maxsim.reference import maxsim_reference
from triton_dispatch.testing import assert_close, randn

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")


def _qd(rng, device, nq=2, nd=3, lq=5, ld=7, dim=16, dtype=torch.float32):
    return (
        randn((nq, lq, dim), generator=rng, device=device, dtype=dtype),
        randn((nd, ld, dim), generator=rng, device=device, dtype=dtype),
    )


def test_mismatched_embedding_size(rng, device):
    Q, _ = _qd(rng, device)
    D = randn((3, 7, 8), generator=rng, device=device)
    with pytest.raises(ValueError, match="embedding size d"):
        maxsim(Q, D)
    with pytest.raises(ValueError, match="embedding size d"):
        maxsim_pairs(Q, randn((2, 7, 8), generator=rng, device=device))


@pytest.mark.parametrize(
    ("q_shape", "d_shape", "match"),
    [
        ((16,), (3, 7, 16), "Q must be"),
        ((1, 2, 5, 16), (3, 7, 16), "Q must be"),
        ((2, 5, 16), (16,), "D must be"),  # (Ld, d) is one document, as in 0.4.5
        ((2, 5, 16), (1, 2, 3, 7, 16), "D must be"),
        ((2, 5, 16), (3, 4, 7, 16), "4-D D must be"),
    ],
)
def test_wrong_ranks(device, q_shape, d_shape, match):
    with pytest.raises(ValueError, match=match):
        maxsim(torch.zeros(q_shape, device=device), torch.zeros(d_shape, device=device))


def test_pairs_need_matching_batch(rng, device):
    Q, D = _qd(rng, device, nq=2, nd=3)
    with pytest.raises(ValueError, match="same number of pairs"):
        maxsim_pairs(Q, D)


def test_masks_of_wrong_shape_or_dtype(rng, device):
    Q, D = _qd(rng, device)
    with pytest.raises(ValueError, match=r"q_mask must have shape \(2, 5\)"):
        maxsim(Q, D, q_mask=torch.ones(2, 6, dtype=torch.bool, device=device))
    with pytest.raises(ValueError, match=r"d_mask must have shape \(3, 7\)"):
        maxsim(Q, D, d_mask=torch.ones(7, dtype=torch.bool, device=device))
    with pytest.raises(TypeError, match="q_mask must be a bool tensor"):
        maxsim(Q, D, q_mask=torch.ones(2, 5, device=device))
    with pytest.raises(TypeError, match="d_mask must be a bool tensor"):
        maxsim(Q, D, d_mask=torch.ones(3, 7, dtype=torch.int64, device=device))
    D4 = randn((2, 3, 7, 16), generator=rng, device=device)
    with pytest.raises(ValueError, match=r"d_mask must have shape \(2, 3, 7\)"):
        maxsim(Q, D4, d_mask=torch.ones(3, 7, dtype=torch.bool, device=device))


def test_errors_keep_the_published_key_phrases(rng, device):
    """0.4.5's wording, which callers' ``pytest.raises(match=...)`` looks for, in our messages
    for the same situations (which still name the argument and the expected shape)."""
    Q, D = _qd(rng, device, nq=3)
    D4 = randn((5, 2, 7, 16), generator=rng, device=device)
    with pytest.raises(ValueError, match=r"D\.shape\[0\] == Q\.shape\[0\]") as info:
        maxsim(Q, D4)
    assert "(Nq, K, Ld, d)" in str(info.value)
    with pytest.raises(ValueError, match=r"Q\.shape\[0\] == D\.shape\[0\]") as info:
        maxsim_pairs(Q, D[:2])
    assert "same number of pairs" in str(info.value)
    with pytest.raises(ValueError, match="needs Q to be") as info:
        maxsim(Q[0], D4)
    assert "Q must be (Nq, Lq, d)" in str(info.value)
    with pytest.raises(ValueError, match="q_mask must be") as info:
        maxsim(Q, D4[:3], q_mask=torch.ones(3, 6, dtype=torch.bool, device=device))
    assert "q_mask must have shape (3, 5)" in str(info.value)
    with pytest.raises(ValueError, match="q_mask must be"):
        maxsim(Q[0], D, q_mask=torch.ones(6, dtype=torch.bool, device=device))
    for q, d, name in [(Q[0], D, "Q"), (Q, D[0], "D")]:
        with pytest.raises(ValueError, match=r"\[B, L, d\]") as info:
            maxsim_pairs(q, d)
        assert f"{name} must be (B, L" in str(info.value)


def test_mixed_dtypes_and_unsupported_dtypes(rng, device):
    Q, D = _qd(rng, device)
    with pytest.raises(TypeError, match="share a dtype"):
        maxsim(Q, D.half())
    with pytest.raises(TypeError, match="Q must be float16"):
        maxsim(Q.long(), D.long())


def test_mixed_devices(rng):
    Q, D = _qd(rng, "cpu")
    with pytest.raises(ValueError, match="same device"):
        maxsim(Q, D.to("meta"))
    with pytest.raises(ValueError, match="same device"):
        maxsim(Q, D, d_mask=torch.ones(3, 7, dtype=torch.bool, device="meta"))


def test_unknown_backward_lists_valid_names(rng, device):
    Q, D = _qd(rng, device)
    with pytest.raises(ValueError, match="'auto', 'unified', 'lowmem'"):
        maxsim(Q, D, backward="fast")
    assert resolve_backward(None, 1, 4, 8) == "lowmem"  # the 4-D layout
    assert resolve_backward("auto", 0, 2, 2) == "unified"
    assert resolve_backward("auto", 0, 256, 256) == "unified"  # measured: in-batch stays unified
    assert resolve_backward("auto", 0, 256, 256, 32) == "unified"
    assert resolve_backward("auto", 0, 1, 1000, 32) == "lowmem"  # a rerank: the dense kernel
    assert resolve_backward("auto", 2, 4, 1, 32) == "lowmem"  # pairs
    assert resolve_backward("auto", 3, 4, 1, 32) == "unified"  # varlen
    assert resolve_backward("unified", 1, 4, 8, 32) == "unified"  # an explicit choice stays


def test_normalize_must_be_bool(rng, device):
    Q, D = _qd(rng, device)
    with pytest.raises(TypeError, match="normalize"):
        maxsim(Q, D, normalize="yes")


@pytest.mark.parametrize(("nq", "nd"), [(0, 3), (2, 0), (0, 0)])
def test_empty_batches_give_empty_scores(rng, device, nq, nd):
    Q, D = _qd(rng, device, nq=nq, nd=nd)
    Q.requires_grad_()
    D.requires_grad_()
    out = maxsim(Q, D)
    assert out.shape == (nq, nd) and out.dtype == torch.float32
    out.sum().backward()
    D4 = randn((nq, nd, 7, 16), generator=rng, device=device)
    assert maxsim(Q.detach(), D4).shape == (nq, nd)
    assert maxsim_pairs(Q.detach()[:0], D.detach()[:0]).shape == (0,)


def test_zero_length_queries_score_zero(rng, device):
    Q, D = _qd(rng, device, lq=0)
    assert torch.equal(maxsim(Q, D), torch.zeros(2, 3, device=device))


def test_zero_length_documents(rng, device):
    Q, D = _qd(rng, device, ld=0)
    assert torch.equal(maxsim(Q, D), torch.zeros(2, 3, device=device))  # no gradient: fine
    with pytest.raises(ValueError, match="zero length"):
        maxsim(Q.requires_grad_(), D)
    Qp = randn((4, 16), generator=rng, device=device, requires_grad=True)
    Dp = randn((3, 16), generator=rng, device=device)
    cu_q = torch.tensor([0, 2, 4], device=device)
    cu_d = torch.tensor([0, 3, 3], device=device)
    with pytest.raises(ValueError, match="zero-length document"):
        maxsim_varlen(Qp, Dp, cu_q, cu_d)
    with torch.no_grad():
        out = maxsim_varlen(Qp, Dp, cu_q, cu_d)
    assert out[1] == 0


def test_varlen_validation(rng, device):
    Qp = randn((4, 16), generator=rng, device=device)
    Dp = randn((6, 16), generator=rng, device=device)
    cu = torch.tensor([0, 2, 4], device=device)
    with pytest.raises(TypeError, match="cu_seqlens_q must be int32 or int64"):
        maxsim_varlen(Qp, Dp, cu.float(), cu)
    with pytest.raises(ValueError, match="same length"):
        maxsim_varlen(Qp, Dp, cu, torch.tensor([0, 6], device=device))
    with pytest.raises(ValueError, match="cu_seqlens_d must be non-decreasing"):
        maxsim_varlen(Qp, Dp, cu, torch.tensor([0, 4, 2], device=device))
    with pytest.raises(ValueError, match="cu_seqlens_q must be non-decreasing"):
        maxsim_varlen(Qp, Dp, torch.tensor([0, 2, 9], device=device), cu)
    with pytest.raises(ValueError, match="Q_packed must be"):
        maxsim_varlen(Qp[None], Dp, cu, cu)
    empty = maxsim_varlen(Qp[:0], Dp[:0], cu[:1], cu[:1])
    assert empty.shape == (0,)


def test_non_contiguous_inputs(rng, device):
    Q = randn((16, 5, 2), generator=rng, device=device).permute(2, 1, 0)  # (2, 5, 16)
    D = randn((3, 16, 14), generator=rng, device=device).transpose(1, 2)[:, ::2]  # (3, 7, 16)
    qm = torch.ones(5, 2, dtype=torch.bool, device=device).T
    assert not Q.is_contiguous() and not D.is_contiguous() and not qm.is_contiguous()
    out = maxsim(Q, D, qm)
    assert_close(out, maxsim_reference(Q.double(), D.double(), qm))
