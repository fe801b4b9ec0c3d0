"""maxsim_residual against decompress + MaxSim in float64, and the packing layout itself."""

from __future__ import annotations

import pytest
import torch

from late_interaction_kernels.ops.maxsim_residual import maxsim_residual
from late_interaction_kernels.ops.maxsim_residual.op import residual_forward_op
from late_interaction_kernels.ops.maxsim_residual.reference import (
    decompress,
    maxsim_residual_reference,
    pack_buckets,
    unpack_buckets,
)
from triton_dispatch.testing import assert_close

DIM, C = 8, 6


def collection(rng, doclens, nbits, dim=DIM, device="cpu"):
    n = sum(doclens)
    centroids = torch.nn.functional.normalize(torch.randn(C, dim, generator=rng), dim=-1)
    codes = torch.randint(0, C, (n,), generator=rng)
    buckets = torch.randint(0, 1 << nbits, (n, dim), generator=rng)
    weights = torch.sort(torch.randn(1 << nbits, generator=rng) * 0.2).values
    parts = (
        centroids,
        codes,
        pack_buckets(buckets, nbits),
        weights,
        torch.tensor(doclens, dtype=torch.long),
    )
    return tuple(t.to(device) for t in parts)


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
@pytest.mark.parametrize(("chunk_size", "backend"), [(2, "torch"), (64, "torch"), (2, None)])
def test_scores_and_query_gradient(nbits, chunk_size, backend, rng):
    doclens = [3, 1, 4, 2, 5]
    parts = collection(rng, doclens, nbits)
    Q = torch.randn(2, 3, DIM, generator=rng, requires_grad=True)
    q_mask = torch.tensor([[True, True, False], [True, True, True]])
    got = maxsim_residual(
        Q, *parts, nbits=nbits, q_mask=q_mask, chunk_size=chunk_size, backend=backend
    )
    Q64 = Q.detach().double().requires_grad_(True)
    want = maxsim_residual_reference(Q64, *parts, nbits=nbits, q_mask=q_mask)
    assert got.shape == (2, 5) and got.dtype == torch.float32
    assert_close(got, want, name="scores")
    g = torch.randn(2, 5, generator=rng)
    (got * g).sum().backward()
    (want * g.double()).sum().backward()
    assert_close(Q.grad, Q64.grad, name="gradient of Q")


@pytest.mark.parametrize("backend", ["torch", None])
def test_zero_length_document(backend, rng):
    parts = collection(rng, [2, 0, 3], 2)
    Q = torch.randn(2, 3, DIM, generator=rng)
    with torch.no_grad():
        scores = maxsim_residual(Q, *parts, nbits=2, backend=backend)
    assert torch.equal(scores[:, 1], torch.zeros(2))
    assert_close(scores, maxsim_residual_reference(Q.double(), *parts, nbits=2), name="scores")
    with pytest.raises(ValueError, match="zero-length document"):
        maxsim_residual(Q.requires_grad_(True), *parts, nbits=2, backend=backend)


@pytest.mark.parametrize("backend", ["torch", None])
def test_empty_collection(backend, rng):
    parts = collection(rng, [], 2)
    out = maxsim_residual(torch.randn(2, 3, DIM), *parts, nbits=2, backend=backend)
    assert out.shape == (2, 0)


@pytest.mark.parametrize("backend", ["torch", None])
def test_all_documents_empty_and_empty_queries(backend, rng):
    parts = collection(rng, [0, 0], 2)
    with torch.no_grad():
        out = maxsim_residual(torch.randn(2, 3, DIM), *parts, nbits=2, backend=backend)
        none = maxsim_residual(torch.randn(0, 3, DIM), *parts, nbits=2, backend=backend)
    assert torch.equal(out, torch.zeros(2, 2)) and none.shape == (0, 2)


# the Triton path (interpreted here): every packing width, a width that is not a power of two,
# documents longer than one tile (16 tokens under the interpreter), fp32 and fp16 queries
@pytest.mark.parametrize("nbits", [1, 2, 4, 8])
@pytest.mark.parametrize(("dim", "dtype"), [(16, torch.float32), (24, torch.float16)])
def test_fused_kernel_matches_reference(nbits, dim, dtype, rng, device):
    """Scores against the float64 reference; the query gradient against the float64 formula at
    the winners the kernel saved (fp16 rounding may swap near-tied winners, and a swap moves a
    gradient row by a whole token)."""
    parts = collection(rng, [3, 20, 1, 17, 5], nbits, dim, device)
    Q = torch.randn(3, 5, dim, generator=rng).to(device, dtype).requires_grad_(True)
    q_mask = (torch.rand(3, 5, generator=rng) > 0.3).to(device)
    got = maxsim_residual(Q, *parts, nbits=nbits, q_mask=q_mask)
    Q64 = Q.detach().double().requires_grad_(True)
    want = maxsim_residual_reference(Q64, *parts, nbits=nbits, q_mask=q_mask)
    assert got.dtype == torch.float32
    assert_close(got, want, dtype=dtype, name="scores")
    offsets = torch.cat([parts[4].new_zeros(1), parts[4].cumsum(0)])
    with torch.no_grad():
        _, winners = residual_forward_op(Q, q_mask, *parts[:4], offsets, nbits, True)
    assert winners.shape == (3, 5, 5) and bool(((winners >= 0) == q_mask[:, None, :]).all())
    tokens = decompress(*parts[:4], nbits).double()
    picked = torch.einsum("qid,qnid->qni", Q64, tokens[winners.clamp(min=0)])
    at_winners = torch.where(winners >= 0, picked, 0.0).sum(2)
    g = torch.randn(got.shape, generator=rng).to(device)
    (got * g).sum().backward()
    (at_winners * g.double()).sum().backward()
    assert Q.grad.dtype == dtype
    assert_close(Q.grad, Q64.grad, dtype=dtype, name="gradient of Q")


def test_fused_kernel_long_query(rng, device):
    # 80 query-token rows: five 16-row blocks, each spanning two queries
    parts = collection(rng, [4, 18], 4, 16, device)
    Q = torch.randn(2, 40, 16, generator=rng).to(device).requires_grad_(True)
    got = maxsim_residual(Q, *parts, nbits=4)
    Q64 = Q.detach().double().requires_grad_(True)
    want = maxsim_residual_reference(Q64, *parts, nbits=4)
    assert_close(got, want, name="scores")
    got.sum().backward()
    want.sum().backward()
    assert_close(Q.grad, Q64.grad, name="gradient of Q")


def test_fused_and_torch_paths_agree(rng, device):
    parts = collection(rng, [6, 2, 19], 2, 16, device)
    Q = torch.randn(4, 3, 16, generator=rng).to(device)
    fused = maxsim_residual(Q, *parts, nbits=2)
    plain = maxsim_residual(Q, *parts, nbits=2, backend="torch")
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)


def test_fused_path_never_decompresses_the_collection(rng, monkeypatch, device):
    import late_interaction_kernels.ops.maxsim_residual.torch_path as module

    def forbidden(*args, **kwargs):
        raise AssertionError("the Triton path decompressed the collection in PyTorch")

    monkeypatch.setattr(module, "decompress", forbidden)
    parts = collection(rng, [3, 4], 2, device=device)
    Q = torch.randn(2, 3, DIM, generator=rng).to(device).requires_grad_(True)
    maxsim_residual(Q, *parts, nbits=2).sum().backward()
    assert Q.grad is not None


@pytest.mark.parametrize(
    ("index", "value", "message"),
    [
        (0, torch.randn(C, DIM + 1), "centroids must be"),
        (1, torch.zeros(7, dtype=torch.long), r"packed_residuals must be a uint8 .* = \(7, 2\)"),
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


_COMPILE_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from compile_for_hopper import compile_one
from late_interaction_kernels.ops.maxsim_residual import kernels

fwd = {{
    "Q": "*bf16", "C": "*fp32", "CODES": "*i64", "PACKED": "*u8", "WEIGHTS": "*fp32",
    "OFFSETS": "*i64", "BEST": "*fp32", "ARGMAX": "*i64", "q_rows": "i32", "n_doc": "i32",
    "lq": "i32", "dim": "i32", "width": "i32", "max_len": "i32", "Q_BUCKET": "i32",
}}
for nbits, dim_block, bq, save, bt in (
    (2, 128, 128, False, 64), (4, 128, 64, True, 32), (1, 64, 64, True, 64), (8, 128, 128, True, 32),
):
    cx = dict(NBITS=nbits, SAVE_ARGMAX=save, UPCAST=False, IEEE=False, DYNAMIC_BOUNDS=True,
              NORM_EPS=1e-12, BLOCK_K=dim_block, BLOCK_Q=bq, BLOCK_T=bt)
    compile_one(kernels.residual_fwd_kernel, fwd, cx)
compile_one(kernels.residual_fwd_kernel, dict(fwd, Q="*fp32", C="*bf16", CODES="*i32"),
            dict(cx, IEEE=True))
compile_one(kernels.residual_fwd_kernel, dict(fwd, Q="*fp16", C="*fp16", WEIGHTS="*fp16"), cx)
bwd = {{
    "GRAD": "*fp32", "ARGMAX": "*i64", "C": "*fp32", "CODES": "*i64", "PACKED": "*u8",
    "WEIGHTS": "*fp32", "GQ": "*fp32", "n_doc": "i32", "lq": "i32", "dim": "i32",
    "width": "i32", "docs_per_split": "i32",
}}
for nbits in (2, 4):
    compile_one(kernels.residual_grad_q_kernel, bwd,
                dict(NBITS=nbits, NORM_EPS=1e-12, BLOCK_K=128, BLOCK_Q=32))
print("compiled")
"""


def test_kernels_compile_for_hopper(compile_on_hopper):
    compile_on_hopper(_COMPILE_SCRIPT)


def test_fullgraph_compile_of_the_fused_path(rng):
    """No graph break: the data checks of the collection are skipped under torch.compile and the
    kernels are custom ops (run here in the interpreter inside the compiled graph)."""
    torch._dynamo.reset()
    parts = collection(rng, [3, 18, 5], 4, 16)
    Q = torch.randn(2, 5, 16, generator=rng, requires_grad=True)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def loss_fn(q):
        return maxsim_residual(q, *parts, nbits=4).logsumexp(-1).sum()

    loss = loss_fn(Q)
    loss.backward()
    Q64 = Q.detach().double().requires_grad_(True)
    want = maxsim_residual_reference(Q64, *parts, nbits=4).logsumexp(-1).sum()
    want.backward()
    assert_close(loss, want, name="loss")
    assert_close(Q.grad, Q64.grad, name="gradient of Q")
