"""Packed all-pairs scoring, pair lists and padded reranking against their float64 references,
values and gradients."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from late_interaction_kernels.padded import PackedBatch, maxsim_padded, pack_padded
from late_interaction_kernels.reference import (
    maxsim_padded_reference,
    maxsim_reference_scatter,
    maxsim_reference_varlen,
)
from late_interaction_kernels.score_pairs import score_pairs_packed
from late_interaction_kernels.varlen import maxsim_varlen
from triton_dispatch.testing import assert_gradients_match


def _packed(rng, lengths, dim=8):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    x = torch.randn(int(cu[-1]), dim, generator=rng, requires_grad=True)
    return x, cu


@pytest.mark.parametrize("backend", [None, "torch"])
def test_varlen_all_pairs_with_independent_counts(rng, backend):
    Q, cu_q = _packed(rng, [3, 1, 4])
    D, cu_d = _packed(rng, [2, 5, 0, 1, 3])  # an empty document scores 0
    assert_gradients_match(
        lambda q, d: maxsim_varlen(q, d, cu_q, cu_d, backend=backend),
        lambda q, d: maxsim_reference_varlen(q, d, cu_q, cu_d),
        [Q, D], generator=rng, names=["Q_packed", "D_packed"],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("method", "normalize", "split"), [("unified", False, False), ("lowmem", True, True)]
)
def test_varlen_all_pairs_runs_on_the_packed_tokens(rng, monkeypatch, method, normalize, split):
    """The kernels read the packed tokens through the offsets: no padded copy (``pad`` is never
    called). Packed rows before ``cu[0]`` and after ``cu[-1]`` belong to no sequence and get a
    zero gradient; a query longer than one chunk is scored in chunks; ``split``: grad_Q splits
    each query's documents over programs (partial sums), as on a GPU with many documents."""
    from late_interaction_kernels.ops.maxsim import backward_plan, plan
    from late_interaction_kernels.ops.varlen import dispatch as varlen

    if split:
        monkeypatch.setattr(backward_plan, "DOCS_PER_SPLIT", 1)
        monkeypatch.setattr(backward_plan, "MIN_DOCS_PER_SPLIT", 1)

    unit = (lambda x: torch.nn.functional.normalize(x, dim=-1)) if normalize else (lambda x: x)
    monkeypatch.setattr(varlen, "pad", None)
    monkeypatch.setattr(plan, "LONG_QUERY_THRESHOLD", 4)
    monkeypatch.setattr(plan, "QUERY_CHUNK", 4)
    Q = torch.randn(2 + 3 + 6 + 1 + 1, 8, generator=rng, requires_grad=True)
    cu_q = torch.tensor([2, 5, 11, 12])  # rows 0-1 and 12 outside every query
    D = torch.randn(1 + 4 + 7 + 2, 8, generator=rng, requires_grad=True)
    cu_d = torch.tensor([1, 5, 5, 12, 14], dtype=torch.int32)  # an empty document
    assert_gradients_match(
        lambda q, d: maxsim_varlen(q, d, cu_q, cu_d, normalize=normalize, backward=method),
        lambda q, d: maxsim_reference_varlen(unit(q), unit(d), cu_q, cu_d),
        [Q, D], generator=rng, names=["Q_packed", "D_packed"],
    )  # fmt: skip


def test_varlen_max_seqlen_is_a_bound(rng):
    Q, cu_q = _packed(rng, [3, 1])
    D, cu_d = _packed(rng, [2, 5])
    assert maxsim_varlen(Q, D, cu_q, cu_d, 3, 9).shape == (2, 2)
    with pytest.raises(ValueError, match="max_seqlen_d=4"):
        maxsim_varlen(Q, D, cu_q, cu_d, max_seqlen_d=4)
    with pytest.raises(ValueError, match="Q_packed must be 2-D"):
        maxsim_varlen(Q[None], D, cu_q, cu_d)
    with pytest.raises(TypeError, match="cu_seqlens_q must be int32 or int64"):
        maxsim_varlen(Q, D, cu_q.float(), cu_d)


def test_score_pairs_packed(rng):
    Q, cu_q = _packed(rng, [3, 1, 4])
    D, cu_d = _packed(rng, [2, 5, 1, 3])
    pq = torch.tensor([0, 2, 2, 1, 0], dtype=torch.int32)
    pd = torch.tensor([3, 0, 1, 1, 3], dtype=torch.int32)
    assert_gradients_match(
        lambda q, d: score_pairs_packed(q, d, cu_q, cu_d, pq, pd),
        lambda q, d: maxsim_reference_scatter(q, d, cu_q, cu_d, pq, pd),
        [Q, D], generator=rng, names=["Q_packed", "D_packed"],
    )  # fmt: skip
    with pytest.raises(ValueError, match="must index the"):
        score_pairs_packed(Q, D, cu_q, cu_d, pq, pd + 4)


def _padded(rng, b=2, c=3, lq=4, ld=5, dim=8):
    queries = torch.randn(b, lq, dim, generator=rng, requires_grad=True)
    documents = torch.randn(b, c, ld, dim, generator=rng, requires_grad=True)
    qlen = torch.randint(1, lq + 1, (b,), generator=rng)
    dlen = torch.randint(0, ld + 1, (b, c), generator=rng)
    return queries, documents, qlen, dlen


def test_maxsim_padded(rng):
    queries, documents, qlen, dlen = _padded(rng)
    assert_gradients_match(
        lambda q, d: maxsim_padded(q, d, qlen, dlen),
        lambda q, d: maxsim_padded_reference(q, d, qlen, dlen),
        [queries, documents], generator=rng, names=["queries", "documents"],
    )  # fmt: skip


def test_pack_padded_feeds_score_pairs(rng):
    queries, documents, qlen, dlen = _padded(rng)
    batch = pack_padded(queries, documents, qlen, dlen)
    Q, cu_q, D, cu_d, pq, pd, max_q, max_d = batch
    assert cu_q.dtype == cu_d.dtype == pq.dtype == torch.int32
    assert (max_q, max_d) == (int(qlen.max()), int(dlen.max()))
    got = score_pairs_packed(Q, D, cu_q, cu_d, pq, pd, max_seqlen_q=max_q, max_seqlen_d=max_d)
    want = maxsim_padded_reference(queries.double(), documents.double(), qlen, dlen)
    torch.testing.assert_close(got.double(), want.reshape(-1), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="doc_lengths must all be > 0"):
        pack_padded(queries, documents, qlen, dlen * 0, validate=True)
    with pytest.raises(ValueError, match="query_lengths must lie in"):
        pack_padded(queries, documents, qlen + 10, dlen)


PACKED_BATCH = [
    ("Q_packed", torch.Tensor), ("cu_seqlens_q", torch.Tensor), ("D_packed", torch.Tensor),
    ("cu_seqlens_d", torch.Tensor), ("pair_q_idx", torch.Tensor), ("pair_d_idx", torch.Tensor),
    ("max_seqlen_q", int), ("max_seqlen_d", int),
]  # fmt: skip


def test_packed_batch_constructor_is_the_published_one(rng):
    """0.4.5's ``PackedBatch(Q_packed, cu_seqlens_q, D_packed, cu_seqlens_d, pair_q_idx,
    pair_d_idx, max_seqlen_q, max_seqlen_d)``: a frozen dataclass whose fields are typed with the
    classes, every parameter required, positional or by name, values kept as given."""
    assert [(f.name, f.type) for f in dataclasses.fields(PackedBatch)] == PACKED_BATCH
    params = inspect.signature(PackedBatch).parameters
    assert [(name, p.annotation) for name, p in params.items()] == PACKED_BATCH
    assert all(
        p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.default is inspect.Parameter.empty
        for p in params.values()
    )
    queries, documents, qlen, dlen = _padded(rng)
    batch = pack_padded(queries, documents, qlen, dlen)
    values = list(batch)
    assert len(values) == 8 and all(v.device == queries.device for v in values[:6])
    by_position = PackedBatch(*values)
    by_name = PackedBatch(**{name: getattr(batch, name) for name, _ in PACKED_BATCH})
    for built in (by_position, by_name):
        assert all(a is b for a, b in zip(built, values))
    with pytest.raises(TypeError):
        PackedBatch(*values[:-1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.max_seqlen_q = 0
    assert dataclasses.replace(batch, max_seqlen_d=99).max_seqlen_d == 99
    # a batch built by hand feeds the scorer like pack_padded's own
    Q, cu_q, D, cu_d, pq, pd, max_q, max_d = by_name
    got = score_pairs_packed(Q, D, cu_q, cu_d, pq, pd, max_seqlen_q=max_q, max_seqlen_d=max_d)
    want = maxsim_padded_reference(queries.double(), documents.double(), qlen, dlen)
    torch.testing.assert_close(got.double(), want.reshape(-1), atol=1e-5, rtol=1e-5)


def test_pack_padded_of_an_empty_batch(rng):
    batch = pack_padded(
        torch.zeros(0, 4, 8), torch.zeros(0, 3, 5, 8), torch.zeros(0, dtype=torch.int64),
        torch.zeros(0, 3, dtype=torch.int64),
    )  # fmt: skip
    assert batch.Q_packed.shape == (0, 8) and batch.D_packed.shape == (0, 8)
    assert batch.cu_seqlens_q.tolist() == [0] and batch.cu_seqlens_d.tolist() == [0]
    assert batch.pair_q_idx.numel() == batch.pair_d_idx.numel() == 0
    assert (batch.max_seqlen_q, batch.max_seqlen_d) == (0, 0)
