"""The document index (chunked scoring and top-k) against the reference (full score matrix + topk)
in float64."""

from __future__ import annotations

import datetime
import re

import pytest
import torch

from late_interaction_kernels.ops.retrieve import MaxSimIndex
from late_interaction_kernels.ops.retrieve.reference import retrieve_reference
from triton_dispatch.testing import assert_close, randn


def retrieve(Q, D, k, q_mask=None, d_mask=None, *, chunk_size=None, normalize=False):
    return MaxSimIndex(D, d_mask, chunk_size=chunk_size, normalize=normalize).topk(Q, k, q_mask)


def _inputs(rng, nq=2, nd=5, lq=3, ld=4, dim=8):
    Q = torch.randn(nq, lq, dim, generator=rng)
    D = torch.randn(nd, ld, dim, generator=rng)
    q_mask = torch.rand(nq, lq, generator=rng) > 0.2
    d_mask = torch.rand(nd, ld, generator=rng) > 0.3
    d_mask[:, 0] = True
    return Q, D, q_mask, d_mask


def _check_topk(got, want):
    """Scores equal the reference's top-k; ids may differ from the reference's only among tied
    scores (a fully masked query scores every document 0), so each id must name a distinct document
    whose reference score is the one returned beside it."""
    got_scores, got_ids = got
    want_scores, _, full = want
    assert got_ids.dtype == torch.int64 and got_scores.dtype == torch.float32
    assert_close(got_scores, want_scores, name="top-k scores")
    assert all(len(set(row.tolist())) == len(row) for row in got_ids)
    assert_close(full.gather(1, got_ids), want_scores, name="reference scores of the returned ids")


def _reference(Q, D, k, q_mask, d_mask, **kw):
    """The reference top-k ``(scores, ids)`` and the full float64 score matrix."""
    scores, ids = retrieve_reference(Q.double(), D.double(), k, q_mask, d_mask, **kw)
    all_scores, all_ids = retrieve_reference(Q.double(), D.double(), D.shape[0], q_mask, d_mask, **kw)
    return scores, ids, torch.empty_like(all_scores).scatter_(1, all_ids, all_scores)


@pytest.mark.parametrize("chunk_size", [2, 3, 64])
@pytest.mark.parametrize("normalize", [False, True])
def test_topk_across_chunk_boundaries(chunk_size, normalize, rng):
    Q, D, q_mask, d_mask = _inputs(rng)
    got = retrieve(Q, D, 3, q_mask, d_mask, chunk_size=chunk_size, normalize=normalize)
    want = _reference(Q, D, 3, q_mask, d_mask, normalize=normalize)
    _check_topk(got, want)


def test_uneven_document_list_is_masked_by_length(rng):
    Q, _, q_mask, _ = _inputs(rng)
    lengths = [4, 1, 3, 2, 4]
    docs = [torch.randn(n, 8, generator=rng) for n in lengths]
    padded = torch.nn.utils.rnn.pad_sequence(docs, batch_first=True)
    mask = torch.arange(4) < torch.tensor(lengths)[:, None]
    got = retrieve(Q, docs, 5, q_mask, chunk_size=2)
    _check_topk(got, _reference(Q, padded, 5, q_mask, mask))


def test_scores_are_the_full_matrix(rng):
    Q, D, q_mask, d_mask = _inputs(rng)
    scorer = MaxSimIndex(D, d_mask, chunk_size=2)
    from late_interaction_kernels.ops.maxsim.reference import maxsim_reference

    assert len(scorer) == 5
    assert_close(scorer.scores(Q, q_mask), maxsim_reference(Q.double(), D.double(), q_mask, d_mask))


def test_scoring_keeps_no_graph(rng):
    Q, D, _, _ = _inputs(rng)
    scores, _ = retrieve(Q.requires_grad_(True), D, 2)
    assert not scores.requires_grad


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": 0}, "k must be a positive int"),
        ({"k": True}, "k must be a positive int"),
        ({"k": 2.0}, "k must be a positive int"),
        ({"chunk_size": 0}, "chunk_size must be a positive int"),
        ({"Q": torch.zeros(8)}, r"Q must be a \(Nq, Lq, d\) tensor"),
        ({"Q": torch.zeros(3, 7), "q_mask": None}, "embedding width 7"),
        ({"Q": torch.zeros(2, 3, 7)}, "embedding width 7"),
        ({"D": torch.zeros(5, 8)}, "documents must be"),
        ({"d_mask": torch.ones(5, 4)}, "d_mask must be a bool tensor"),
        ({"q_mask": torch.ones(2, 2, dtype=torch.bool)}, "q_mask must be a bool tensor"),
        ({"D": [], "d_mask": None}, "collection is empty"),
        ({"D": [torch.zeros(2, 8), torch.zeros(3)], "d_mask": None}, r"documents\[1\]"),
        ({"D": [torch.zeros(2, 8)], "d_mask": torch.ones(1, 2, dtype=torch.bool)}, "only accepted"),
    ],
)
def test_bad_inputs_are_named(kwargs, message, rng):
    Q, D, q_mask, d_mask = _inputs(rng)
    args = {"Q": Q, "D": D, "k": 2, "q_mask": q_mask, "d_mask": d_mask, **kwargs}
    chunk = args.pop("chunk_size", None)
    with pytest.raises(ValueError, match=message):
        retrieve(args["Q"], args["D"], args["k"], args["q_mask"], args["d_mask"], chunk_size=chunk)


def test_k_past_the_collection_is_clamped_as_retrieve_does(rng):
    """One behaviour everywhere: ``MaxSimIndex.topk``, :func:`retrieve` and the sharded indexes
    return every document, best first, when ``k`` exceeds the collection."""
    from late_interaction_kernels import retrieve as public_retrieve

    Q, D, q_mask, d_mask = _inputs(rng)
    index = MaxSimIndex(D, d_mask, chunk_size=2)
    scores, ids = index.topk(Q, 50, q_mask)
    assert scores.shape == ids.shape == (2, 5)
    want = public_retrieve(Q, D, 50, q_mask, d_mask, normalize=False, backend="torch")
    assert want[0].shape == (2, 5)
    _check_topk((scores, ids), _reference(Q, D, 5, q_mask, d_mask))


def test_a_single_two_dimensional_query_is_taken(rng):
    """``scores`` and ``topk`` take one ``(Lq, d)`` query (and an ``(Lq,)`` mask), as ``maxsim``,
    ``retrieve`` and ``MaxSimScorer`` do, and answer without the batch dimension."""
    Q, D, q_mask, d_mask = _inputs(rng)
    index = MaxSimIndex(D, d_mask, chunk_size=2)
    full = index.scores(Q, q_mask)
    one = index.scores(Q[1], q_mask[1])
    assert one.shape == (5,)
    assert_close(one, full[1])
    assert_close(index.scores(Q[0]), index.scores(Q[:1])[0])
    scores, ids = index.topk(Q[1], 3, q_mask[1])
    batched = index.topk(Q, 3, q_mask)
    assert scores.shape == ids.shape == (3,)
    assert_close(scores, batched[0][1])
    assert torch.equal(ids, batched[1][1])
    with pytest.raises(ValueError, match="q_mask must be a bool tensor of shape"):
        index.topk(Q[1], 3, q_mask[1][:2])


@pytest.mark.parametrize("kind", ["padded", "list"])
def test_index_saves_and_loads_to_the_same_results(kind, rng, tmp_path):
    docs = [randn((n, 16), generator=rng) for n in (5, 9, 1, 7)]
    if kind == "padded":
        padded = torch.nn.utils.rnn.pad_sequence(docs, batch_first=True)
        mask = torch.arange(padded.shape[1]) < torch.tensor([5, 9, 1, 7])[:, None]
        index = MaxSimIndex(padded, mask, chunk_size=3, normalize=True)
    else:
        index = MaxSimIndex(docs, chunk_size=3, normalize=True)
    index.save(tmp_path / "index.pt")
    loaded = MaxSimIndex.load(tmp_path / "index.pt")
    assert (len(loaded), loaded.dim, loaded.chunk_size, loaded.normalize) == (4, 16, 3, True)
    Q = randn((2, 4, 16), generator=rng)
    torch.testing.assert_close(loaded.scores(Q), index.scores(Q), rtol=0, atol=0)
    s0, i0 = index.topk(Q, 2)
    s1, i1 = loaded.topk(Q, 2)
    assert torch.equal(i0, i1) and torch.equal(s0, s1)


def test_loading_a_file_that_is_not_an_index_names_it(tmp_path):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"other\.pt"):
        MaxSimIndex.load(tmp_path / "other.pt")
    torch.save({"format": 1, "chunk_size": 2, "normalize": False, "dim": 4}, tmp_path / "cut.pt")
    with pytest.raises(ValueError, match="missing the field"):
        MaxSimIndex.load(tmp_path / "cut.pt")


def _write_bad_index(kind: str, path) -> None:
    good = path.with_suffix(".good")
    MaxSimIndex([torch.ones(2, 4), torch.ones(3, 4)], chunk_size=2).save(good)
    fields = {"format": 1, "chunk_size": 2, "normalize": False, "dim": 4}
    if kind == "text":
        path.write_text("doc_id,text\n1,hello\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(good.read_bytes()[:300])
    elif kind == "pickled_object":
        torch.save({**fields, "created": datetime.date(2024, 1, 1)}, path)
    elif kind == "no_dim":
        del fields["dim"]
        torch.save({**fields, "lengths": torch.tensor([2]), "packed": torch.ones(2, 4)}, path)
    elif kind == "packed_not_tensor":
        torch.save({**fields, "lengths": torch.tensor([2]), "packed": "rows"}, path)
    elif kind == "lengths_not_a_list":
        torch.save({**fields, "lengths": 2, "packed": torch.ones(2, 4)}, path)
    elif kind == "bad_chunk_size":
        fields["chunk_size"] = 0
        torch.save({**fields, "documents": torch.ones(2, 3, 4), "d_mask": None}, path)
    elif kind == "documents_not_tensor":
        torch.save({**fields, "documents": "docs", "d_mask": None}, path)


@pytest.mark.parametrize(
    "kind",
    [
        "text",
        "empty",
        "truncated",
        "pickled_object",
        "no_dim",
        "packed_not_tensor",
        "lengths_not_a_list",
        "bad_chunk_size",
        "documents_not_tensor",
    ],
)
def test_every_unreadable_index_file_raises_value_error_naming_it(kind, tmp_path):
    path = tmp_path / f"{kind}.pt"
    _write_bad_index(kind, path)
    with pytest.raises(ValueError, match=re.escape(repr(str(path)))) as caught:
        MaxSimIndex.load(path)
    assert caught.value.__cause__ is not None  # the reader's own error stays in the traceback


def test_a_missing_index_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent"):
        MaxSimIndex.load(tmp_path / "absent.pt")
