"""The forward kernels' variants that the interpreter's single configs do not reach on their own,
run by the Triton interpreter: the Hopper path (TMA tensor descriptors, tile-wide running max)
with the device check and the query-length threshold forced open (every layout, masks,
normalisation, gradients through its argmax, documents whose last tile runs into the next
document or past the tensor, the fall-back for a view whose base is not 16-byte aligned), and the
generic kernels' per-tile row reduction."""

from __future__ import annotations

import pytest
import torch
import triton

from late_interaction_kernels import maxsim, maxsim_varlen
from late_interaction_kernels.ops.common import tma
from late_interaction_kernels.ops.maxsim import forward, plan
from late_interaction_kernels.ops.maxsim.dispatch import MAXSIM_PLANS
from late_interaction_kernels.ops.maxsim.reference import maxsim_reference
from late_interaction_kernels.ops.varlen.reference import maxsim_varlen_all_pairs_reference
from triton_dispatch import interpreter_enabled
from triton_dispatch.testing import assert_close, assert_gradients_match, rand_mask, randn

pytestmark = pytest.mark.skipif(
    not interpreter_enabled(), reason="forces the TMA kernel under the Triton interpreter"
)


@pytest.fixture
def tma_forced(monkeypatch):
    monkeypatch.setattr(tma, "tma_supported", lambda device: True)
    monkeypatch.setattr(plan, "TMA_MIN_QUERY_LEN", 1)
    plan.FORWARD_PLANS.clear()
    MAXSIM_PLANS.clear()
    yield
    plan.FORWARD_PLANS.clear()
    MAXSIM_PLANS.clear()


def _generic_launch_forbidden():
    """Make every cached forward plan fail if it takes the generic kernel; returns the plans."""
    plans = list(plan.FORWARD_PLANS._plans.values())
    assert plans and all(p.tma is not None for p in plans)

    def fail(*args):
        raise AssertionError("the generic forward kernel ran where the TMA kernel should")

    for p in plans:
        p.launch = fail
    return plans


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("doc_shape", [(3, 21), (2, 3, 21)], ids=["all-pairs", "grouped"])
def test_tma_forward_matches_reference(tma_forced, rng, doc_shape, normalize):
    # d = 24: a descriptor box of 32 columns, zero-filled past the row; Ld = 21 with 16-row tiles:
    # the second tile reads 11 rows of the next document (or past the tensor, for the last one)
    Q = randn((2, 19, 24), generator=rng, dtype=torch.float16)
    D = randn((*doc_shape, 24), generator=rng, dtype=torch.float16)
    qm, dm = rand_mask((2, 19), generator=rng), rand_mask(doc_shape, generator=rng)
    got = maxsim(Q, D, qm, dm, normalize=normalize)
    _generic_launch_forbidden()
    again = maxsim(Q, D, qm, dm, normalize=normalize)
    want = maxsim_reference(Q.double(), D.double(), qm, dm, normalize=normalize)
    assert_close(got, want, dtype=torch.float16)
    assert torch.equal(got, again)


def _assert_gradients_with_doc_mask(Q, D, dm, rng):
    assert_gradients_match(
        lambda q, d: maxsim(q, d, None, dm),
        lambda q, d: maxsim_reference(q, d, None, dm),
        [Q, D], generator=rng, names=["Q", "D"],
    )  # fmt: skip


def test_tma_forward_gradients(tma_forced, rng):
    """Training calls save the argmax from the tile-wide running max (first column reaching each
    row's best), which the backward kernels read."""
    Q = randn((2, 19, 24), generator=rng, dtype=torch.float16, requires_grad=True)
    D = randn((3, 21, 24), generator=rng, dtype=torch.float16, requires_grad=True)
    dm = rand_mask((3, 21), generator=rng)
    _assert_gradients_with_doc_mask(Q, D, dm, rng)
    _generic_launch_forbidden()


def _assert_first_tied_column_wins(dtype):
    """Equal similarities in several columns (duplicated document tokens, in different tiles and
    column slots): the gradient goes to the first."""
    q = torch.zeros(1, 2, 16, dtype=dtype)
    q[0, :, 0] = 1.0
    d = torch.zeros(1, 40, 16, dtype=dtype)
    # 16-column tiles: ties in three tiles, rows 8 and 24 in the same column slot of theirs
    d[0, [8, 21, 24, 35], 0] = 2.0
    Q, D = q.clone().requires_grad_(), d.clone().requires_grad_()
    maxsim(Q, D).sum().backward()
    rows = D.grad[0, :, 0].nonzero().flatten().tolist()
    assert rows == [8], rows


def test_tma_argmax_keeps_the_first_of_tied_columns(tma_forced):
    _assert_first_tied_column_wins(torch.float16)


def test_tma_varlen_all_pairs(tma_forced, rng):
    lengths_q, lengths_d = [7, 19, 1], [21, 0, 16, 5]
    Q = randn((sum(lengths_q), 16), generator=rng, dtype=torch.float16)
    D = randn((sum(lengths_d), 16), generator=rng, dtype=torch.float16)
    cu_q = torch.tensor([0, 7, 26, 27], dtype=torch.int32)
    cu_d = torch.tensor([0, 21, 21, 37, 42], dtype=torch.int32)
    got = maxsim_varlen(Q, D, cu_q, cu_d)
    want = maxsim_varlen_all_pairs_reference(Q.double(), D.double(), cu_q, cu_d)
    assert_close(got, want, dtype=torch.float16)


def test_unaligned_view_takes_the_generic_kernel(tma_forced, rng):
    """A descriptor's base must be 16-byte aligned; a view starting one element in runs the
    generic kernel under the same plan."""
    flat = randn((1 + 2 * 19 * 16,), generator=rng, dtype=torch.float16)
    Q = flat[1:].view(2, 19, 16)
    D = randn((3, 21, 16), generator=rng, dtype=torch.float16)
    got = maxsim(Q, D)
    assert_close(got, maxsim_reference(Q.double(), D.double()), dtype=torch.float16)
    with pytest.raises(AssertionError, match="generic forward kernel"):
        _generic_launch_forbidden()
        maxsim(Q, D)


@pytest.fixture
def per_tile_reduction(monkeypatch):
    """The generic kernels with ``TILE_MAX=False`` (a row max per tile), which the autotuner may
    pick on a GPU; the interpreter's one config has the tile-wide running max."""
    for kernel, blocks in (
        (forward.maxsim_fwd_kernel, {"BLOCK_Q": 16, "BLOCK_D": 16, "ONE_LOOP": False}),
        (forward.maxsim_fwd_query_group_kernel, {"BLOCK_Q": 64, "BLOCK_D": 16}),
    ):
        config = triton.Config({**blocks, "TILE_MAX": False}, num_warps=4, num_stages=1)
        monkeypatch.setattr(kernel, "configs", [config])
    plan.FORWARD_PLANS.clear()
    MAXSIM_PLANS.clear()
    yield
    plan.FORWARD_PLANS.clear()
    MAXSIM_PLANS.clear()


@pytest.mark.parametrize("nq", [1, 5], ids=["one-query", "query-groups"])
def test_per_tile_reduction_variant(per_tile_reduction, rng, nq):
    Q = randn((nq, 7, 16), generator=rng, requires_grad=True)
    D = randn((3, 37, 16), generator=rng, requires_grad=True)
    dm = rand_mask((3, 37), generator=rng)
    _assert_gradients_with_doc_mask(Q, D, dm, rng)
    _assert_first_tied_column_wins(torch.float32)
