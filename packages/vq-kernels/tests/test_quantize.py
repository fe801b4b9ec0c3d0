"""quantize: the fused kernel (interpreter on CPU) against the float64 reference."""

from __future__ import annotations

import pytest
import torch

from triton_dispatch.testing import randint, randn
from vq_kernels import quantize
from vq_kernels.ops.quantize.reference import distances_reference, quantize_reference


def _assert_nearest(codes, x, codebook, metric, tol):
    """The chosen code's float64 distance equals the float64 minimum within ``tol`` (near-ties
    computed in other arithmetic may pick another code of the same distance)."""
    d = distances_reference(x.double(), codebook.double(), metric)
    chosen = d.gather(1, codes.view(-1, 1))[:, 0]
    best = d.min(1).values
    scale = 1.0 + best.abs()
    assert ((chosen - best) <= tol * scale).all(), (chosen - best).max()


@pytest.mark.parametrize("metric", ["l2", "cosine"])
@pytest.mark.parametrize(
    "batch, num_codes, dim", [(37, 45, 20), (1, 3, 5), (20, 300, 16), (9, 7, 70)]
)
def test_codes_are_nearest(batch, num_codes, dim, metric, rng):
    x = randn((batch, dim), generator=rng)
    codebook = randn((num_codes, dim), generator=rng)
    codes, quantized = quantize(x, codebook, metric=metric)
    assert codes.shape == (batch,) and codes.dtype == torch.int64
    _assert_nearest(codes, x, codebook, metric, 1e-5)
    assert torch.equal(quantized, codebook[codes])


@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_well_separated_inputs_match_exactly(metric, rng):
    codebook = randn((50, 24), generator=rng, scale=10.0)
    picks = randint(0, 50, (33,), generator=rng)
    x = codebook[picks] + randn((33, 24), generator=rng, scale=0.01)
    codes, _ = quantize(x, codebook, metric=metric)
    assert torch.equal(codes, picks)
    assert torch.equal(codes, quantize_reference(x.double(), codebook.double(), metric))


def _norms(codebook):
    return torch.linalg.vector_norm(codebook, dim=-1, dtype=torch.float32)


@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_ties_go_to_the_lowest_index_across_tiles(metric, rng, device):
    """Duplicate codes inside one tile and across tiles (interpreter tiles are 16 wide) and
    across K splits: the lowest index wins, like torch.argmin."""
    from vq_kernels.ops.quantize.kernels import nearest_code

    codebook = randn((300, 8), generator=rng)
    codebook[[5, 9, 40, 200]] = codebook[3].clone()
    codebook[[150, 290]] = codebook[140].clone()
    x = torch.cat([codebook[[3, 140]], codebook[[3]] + 1e-3]).to(device)
    codebook = codebook.to(device)
    codes, _ = quantize(x, codebook, metric=metric)
    assert codes.tolist() == [3, 140, 3]
    for splits in (1, 3):
        got = nearest_code(x, codebook, _norms(codebook), metric, splits=splits)
        assert got.dtype == torch.int64 and got.tolist() == [3, 140, 3]
    d = distances_reference(x.double(), codebook.double(), "l2")
    assert torch.argmin(d[:2], 1).tolist() == [3, 140]


def test_k_splits_agree_with_one_split(rng, device):
    from vq_kernels.ops.quantize.kernels import nearest_code

    x = randn((21, 12), generator=rng, device=device)
    codebook = randn((300, 12), generator=rng, device=device)
    one = nearest_code(x, codebook, _norms(codebook), "l2", splits=1)
    three = nearest_code(x, codebook, _norms(codebook), "l2", splits=3)
    assert torch.equal(one, three)
    _assert_nearest(one.cpu(), x.cpu(), codebook.cpu(), "l2", 1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype, rng):
    x = randn((19, 24), generator=rng, dtype=dtype)
    codebook = randn((40, 24), generator=rng)
    codes, quantized = quantize(x, codebook)
    cb = codebook.to(dtype)
    _assert_nearest(codes, x.double(), cb.double(), "l2", 2e-2)
    assert quantized.dtype == codebook.dtype


def test_k_nearest(rng):
    x = randn((3, 2, 6), generator=rng)
    codebook = randn((20, 6), generator=rng)
    codes, quantized = quantize(x, codebook, k=4)
    assert codes.shape == (3, 2, 4) and quantized.shape == (3, 2, 4, 6)
    want = quantize_reference(x.reshape(-1, 6).double(), codebook.double(), "l2", 4, chunk=7)
    d = distances_reference(x.reshape(-1, 6).double(), codebook.double(), "l2")
    assert torch.equal(codes.reshape(-1, 4), want)
    assert torch.equal(want, torch.sort(d, dim=1, stable=True).indices[:, :4])
    assert torch.equal(quantized, codebook[codes])


def test_leading_dims_and_empty_batch(rng):
    codebook = randn((10, 4), generator=rng)
    codes, q = quantize(randn((2, 3, 4), generator=rng), codebook)
    assert codes.shape == (2, 3) and q.shape == (2, 3, 4)
    codes, q = quantize(torch.empty(0, 4), codebook)
    assert codes.shape == (0,) and q.shape == (0, 4)


def test_gradient_flows_to_the_codebook_only(rng):
    x = randn((12, 5), generator=rng, requires_grad=True)
    codebook = randn((6, 5), generator=rng, requires_grad=True)
    codes, q = quantize(x, codebook)
    upstream = randn((12, 5), generator=rng)
    (q * upstream).sum().backward()
    assert x.grad is None
    want = torch.zeros(6, 5).index_add_(0, codes, upstream)
    torch.testing.assert_close(codebook.grad, want)


def test_nan_row_maps_to_code_zero(rng):
    x = randn((4, 5), generator=rng)
    x[2, 1] = float("nan")
    codebook = randn((7, 5), generator=rng)
    codes, _ = quantize(x, codebook)
    assert codes[2].item() == 0
    assert quantize_reference(x, codebook)[2].item() == 0


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(x=torch.zeros(3, 4), codebook=torch.zeros(5, 3)), ValueError, "last dimension"),
        (dict(x=torch.zeros(3, 4), codebook=torch.zeros(0, 4)), ValueError, "K >= 1"),
        (dict(x=torch.zeros(3, 4), codebook=torch.zeros(4)), ValueError, r"\(K, D\)"),
        (dict(x=torch.zeros(3, 4, dtype=torch.long), codebook=torch.zeros(5, 4)), TypeError, "x"),
        (dict(x=torch.zeros(3, 4), codebook=torch.zeros(5, 4), metric="dot"), ValueError, "metric"),
        (dict(x=torch.zeros(3, 4), codebook=torch.zeros(5, 4), k=6), ValueError, "k must"),
        (dict(x=torch.zeros(3, 4), codebook=torch.zeros(5, 4), k=0), ValueError, "k must"),
        (
            dict(x=torch.zeros(3, 4), codebook=torch.zeros(5, 4, device="meta")),
            ValueError,
            "device",
        ),
        (dict(x=[1.0], codebook=torch.zeros(5, 4)), TypeError, "torch.Tensor"),
    ],
)
def test_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        quantize(**kwargs)
