"""maxsim_residual against decompress + MaxSim in float64, and the packing layout itself."""

from __future__ import annotations

import pytest
import torch

from late_interaction_kernels.ops.maxsim_residual import maxsim_residual
from late_interaction_kernels.ops.maxsim_residual.reference import (
    maxsim_residual_reference,
    pack_buckets,
    unpack_buckets,
)
from triton_dispatch.testing import assert_close

DIM, C = 8, 6


def collection(rng, doclens, nbits):
    n = sum(doclens)
    centroids = torch.nn.functional.normalize(torch.randn(C, DIM, generator=rng), dim=-1)
    codes = torch.randint(0, C, (n,), generator=rng)
    buckets = torch.randint(0, 1 << nbits, (n, DIM), generator=rng)
    weights = torch.linspace(-0.2, 0.2, 1 << nbits)
    return (
        centroids,
        codes,
        pack_buckets(buckets, nbits),
        weights,
        torch.tensor(doclens, dtype=torch.long),
    )


def test_packing_layout_is_colbertv2s():
    # nbits=2, dims 0..3 with indices 1, 2, 3, 0: bits LSB first per dim -> 10 01 11 00
    packed = pack_buckets(torch.tensor([[1, 2, 3, 0]]), 2)
    assert packed.tolist() == [[0b10011100]]
    assert unpack_buckets(packed, 2, 4).tolist() == [[1, 2, 3, 0]]


@pytest.mark.parametrize("nbits", [1, 2, 4, 8])
def test_pack_roundtrip(nbits, rng):
    idx = torch.randint(0, 1 << nbits, (5, DIM), generator=rng)
    assert torch.equal(unpack_buckets(pack_buckets(idx, nbits), nbits, DIM), idx)


@pytest.mark.parametrize("nbits", [2, 4])
@pytest.mark.parametrize("chunk_size", [2, 64])
def test_scores_and_query_gradient(nbits, chunk_size, rng):
    doclens = [3, 1, 4, 2, 5]
    parts = collection(rng, doclens, nbits)
    Q = torch.randn(2, 3, DIM, generator=rng, requires_grad=True)
    q_mask = torch.tensor([[True, True, False], [True, True, True]])
    got = maxsim_residual(Q, *parts, nbits=nbits, q_mask=q_mask, chunk_size=chunk_size)
    Q64 = Q.detach().double().requires_grad_(True)
    want = maxsim_residual_reference(Q64, *parts, nbits=nbits, q_mask=q_mask)
    assert got.shape == (2, 5) and got.dtype == torch.float32
    assert_close(got, want, name="scores")
    g = torch.randn(2, 5, generator=rng)
    (got * g).sum().backward()
    (want * g.double()).sum().backward()
    assert_close(Q.grad, Q64.grad, name="gradient of Q")


def test_zero_length_document(rng):
    parts = collection(rng, [2, 0, 3], 2)
    Q = torch.randn(2, 3, DIM, generator=rng)
    with torch.no_grad():
        scores = maxsim_residual(Q, *parts, nbits=2)
    assert torch.equal(scores[:, 1], torch.zeros(2))
    with pytest.raises(ValueError, match="zero-length document"):
        maxsim_residual(Q.requires_grad_(True), *parts, nbits=2)


def test_empty_collection(rng):
    parts = collection(rng, [], 2)
    assert maxsim_residual(torch.randn(2, 3, DIM), *parts, nbits=2).shape == (2, 0)


@pytest.mark.parametrize(
    ("index", "value", "message"),
    [
        (0, torch.randn(C, DIM + 1), "centroids must be"),
        (1, torch.zeros(7, dtype=torch.long), r"packed_residuals must be a uint8 \(7, 2\)"),
        (1, torch.full((6,), C), "codes must index centroids"),
        (2, torch.zeros(6, 3, dtype=torch.uint8), "packed_residuals must be"),
        (3, torch.zeros(3), r"bucket_weights must be a floating \(4,\)"),
        (4, torch.tensor([3, 2]), "add up to the number of tokens"),
        (4, torch.tensor([7, -1]), "non-negative"),
        (4, torch.tensor([3.0, 3.0]), "doclens must be an integer"),
    ],
)
def test_bad_inputs_are_named(index, value, message, rng):
    parts = list(collection(rng, [3, 3], 2))
    parts[index] = value
    with pytest.raises(ValueError, match=message):
        maxsim_residual(torch.randn(2, 3, DIM), *parts, nbits=2)


@pytest.mark.parametrize(("nbits", "message"), [(3, "nbits must be"), (True, "nbits must be")])
def test_bad_nbits(nbits, message, rng):
    with pytest.raises(ValueError, match=message):
        maxsim_residual(torch.randn(2, 3, DIM), *collection(rng, [3], 2), nbits=nbits)
