"""Sharded exact retrieval: ranks of a gloo process group (interpreted kernels) each search their
shard, and the merged top-k equals ``retrieve`` over the whole collection in one process, equal
scores ordered by global id. Two multi-process runs hold every cross-rank check (each spawn costs
seconds); the single-process checks run without a process group."""

from __future__ import annotations

import os
import re
import tempfile

import pytest
import torch
import torch.distributed as dist

from late_interaction_kernels import MaxSimIndex, ShardedMaxSimIndex, retrieve
from late_interaction_kernels.distributed.sharded_index import _keys
from late_interaction_kernels.ops.maxsim.reference import maxsim_reference
from triton_dispatch.testing import run_ranks

DIM = 16


def _corpus(seed: int, n: int, ld: int = 6):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(n, ld, DIM, generator=g)
    mask = torch.rand(n, ld, generator=g) > 0.3
    mask[:, 0] = True
    return D, mask


def _queries(seed: int = 1, nq: int = 3, lq: int = 4):
    g = torch.Generator().manual_seed(seed)
    Q = torch.randn(nq, lq, DIM, generator=g)
    q_mask = torch.rand(nq, lq, generator=g) > 0.2
    q_mask[:, 0] = True
    return Q, q_mask


def _list_corpus(seed: int, n: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1 + i % 6, DIM, generator=g) for i in range(n)]


def _by_score_then_id(Q, D, k, q_mask=None, d_mask=None, ids=None):
    """The top ``k`` ids of the float64 reference, equal scores by smaller id."""
    scores = maxsim_reference(Q.double(), D.double(), q_mask, d_mask, normalize=True)
    ids = torch.arange(D.shape[0]) if ids is None else ids
    out = []
    for row in scores.tolist():
        ranked = sorted(range(len(row)), key=lambda j: (-row[j], int(ids[j])))
        out.append([int(ids[j]) for j in ranked[:k]])
    return torch.tensor(out)


def _same(got, want) -> bool:
    return torch.equal(got[1], want[1]) and torch.allclose(got[0], want[0], atol=1e-5)


def _error(fn) -> str:
    try:
        fn()
    except (ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


# -- across ranks ---------------------------------------------------------------------------------


def sharded_checks(rank: int, world: int, directory: str) -> dict:
    """Every cross-rank check of one 3-rank run; the parent asserts on what each rank returns."""
    assert world == 3
    out: dict = {}
    Q, q_mask = _queries()

    # uneven padded shards, rank 1 empty: [8, 0, 6]
    D, mask = _corpus(0, 14)
    lo, hi = [(0, 8), (8, 8), (8, 14)][rank]
    index = ShardedMaxSimIndex(D[lo:hi], mask[lo:hi])
    out["counts"] = index.counts
    out["padded"] = index.topk(Q, 7, q_mask)
    out["fused"] = index.topk(Q[1:2], 9)  # k past a shard
    out["clamped"] = index.topk(Q[0], 50)  # k past the whole collection

    # uneven documents as a list, split from a collection every rank holds: [3, 3, 4]
    docs = _list_corpus(2, 10)
    listed = ShardedMaxSimIndex.from_full_corpus(docs)
    out["list_counts"] = listed.counts
    out["list"] = listed.topk(Q, 4, q_mask)

    # exact ties: every document twice (ids j and j + 6), the copies on other ranks
    base, base_mask = _corpus(3, 6)
    twice, twice_mask = torch.cat([base, base]), torch.cat([base_mask, base_mask])
    tied = ShardedMaxSimIndex.from_full_corpus(twice, twice_mask)
    want = _by_score_then_id(Q, twice, 5, q_mask, twice_mask)
    out["ties"] = torch.equal(tied.topk(Q, 5, q_mask)[1], want)
    out["ties_fused"] = torch.equal(tied.topk(Q[:1], 5, q_mask[:1])[1], want[:1])
    # explicit ids, in no order within a shard: ties go to the smaller given id
    given = torch.tensor([40, 7, 31, 12, 25, 3, 18, 9, 50, 1, 44, 22])
    lo, hi = ShardedMaxSimIndex.shard_range(12)
    relabelled = ShardedMaxSimIndex(twice[lo:hi], twice_mask[lo:hi], ids=given[lo:hi])
    want = _by_score_then_id(Q, twice, 5, q_mask, twice_mask, ids=given)
    out["ties_given_ids"] = torch.equal(relabelled.topk(Q, 5, q_mask)[1], want)
    out["ties_given_ids_fused"] = torch.equal(relabelled.topk(Q[:1], 5, q_mask[:1])[1], want[:1])

    # add: ranks 0 and 1 add (rank 1 a list to its empty shard), rank 2 nothing
    extra, extra_mask = _corpus(4, 5)
    if rank == 0:
        new = index.add(extra[:2], extra_mask[:2])
    elif rank == 1:
        new = index.add([extra[j][extra_mask[j]] for j in range(2, 5)])
    else:
        new = index.add()
    out["added_ids"] = new.tolist()
    out["after_add"] = index.topk(Q, 6, q_mask)

    # save and load, one file per rank
    path = index.save(directory)
    out["file"] = os.path.basename(path)
    loaded = ShardedMaxSimIndex.load(directory)
    out["loaded"] = _same(loaded.topk(Q, 6, q_mask), index.topk(Q, 6, q_mask))
    out["loaded_ids"] = torch.equal(loaded.ids, index.ids) and loaded.counts == index.counts
    out["loaded_then_add"] = loaded.add(extra[:1] if rank == 2 else None).tolist()
    pair = dist.new_group([0, 1])
    if rank < 2:  # a world of 2 cannot read 3 shards
        out["load_two_of_three"] = _error(lambda: ShardedMaxSimIndex.load(directory, group=pair))

    # bad input on one rank: every rank raises, and the index stays usable
    bad_width = torch.randn(2, 6, DIM + 1)
    out["bad_add"] = _error(lambda: index.add(bad_width if rank == 2 else None))
    out["bad_k"] = _error(lambda: index.topk(Q, 0 if rank == 1 else 3, check_ranks=True))
    out["other_shape"] = _error(lambda: index.topk(Q[: 1 + rank], 3, check_ranks=True))
    out["still_usable"] = index.topk(Q, 6, q_mask, check_ranks=True)

    # a collection empty on every rank
    empty = ShardedMaxSimIndex([])
    out["empty"] = _error(lambda: empty.topk(Q, 3))
    return out


def test_sharded_topk_across_three_ranks():
    with tempfile.TemporaryDirectory() as directory:
        results = run_ranks(sharded_checks, 3, directory, timeout=300)
        assert sorted(os.listdir(directory)) == [f"shard-0000{r}-of-00003.pt" for r in (1, 2, 3)]
    # what one process returns for the whole collection (every rank must return the same)
    Q, q_mask = _queries()
    D, mask = _corpus(0, 14)
    extra, extra_mask = _corpus(4, 5)
    whole, whole_mask = torch.cat([D, extra]), torch.cat([mask, extra_mask])
    want = {
        "padded": retrieve(Q, D, 7, q_mask, mask),
        "fused": retrieve(Q[1:2], D, 9, d_mask=mask),
        "clamped": retrieve(Q[0], D, 50, d_mask=mask),
        "list": retrieve(Q, _list_corpus(2, 10), 4, q_mask),
        "after_add": retrieve(Q, whole, 6, q_mask, whole_mask),
    }
    want["still_usable"] = want["after_add"]
    assert want["clamped"][1].shape == (14,)
    for rank, out in enumerate(results):
        failed = {name: value for name, value in out.items() if value is False}
        failed.update({name: out[name] for name in want if not _same(out[name], want[name])})
        assert not failed, f"rank {rank}: {failed}"
        assert out["counts"] == (8, 0, 6) and out["list_counts"] == (3, 3, 4)
        assert out["file"] == f"shard-0000{rank + 1}-of-00003.pt"
        assert out["added_ids"] == [[14, 15], [16, 17, 18], []][rank]
        assert out["loaded_then_add"] == ([19] if rank == 2 else [])
        if rank < 2:
            assert "holds shards of [3] ranks" in out["load_two_of_three"]
        assert "ValueError" in out["bad_add"]
        assert ("width d=17" if rank == 2 else "rank(s) [2] of 3") in out["bad_add"]
        assert ("k must be positive" if rank == 1 else "rank(s) [1] of 3") in out["bad_k"]
        assert "different shapes" in out["other_shape"]
        assert "empty on every rank" in out["empty"]


# -- one process, no process group ----------------------------------------------------------------


def test_single_shard_matches_retrieve_and_breaks_ties_by_id():
    D, mask = _corpus(0, 9)
    Q, q_mask = _queries()
    index = ShardedMaxSimIndex(D, mask)
    assert (index.rank, index.world_size, len(index), index.counts) == (0, 1, 9, (9,))
    assert _same(index.topk(Q, 4, q_mask), retrieve(Q, D, 4, q_mask, mask))
    twice = torch.cat([D[:4], D[:4]])
    ids = torch.tensor([9, 2, 7, 4, 1, 8, 3, 6])
    got = ShardedMaxSimIndex(twice, ids=ids, backend="torch").topk(Q, 5)[1]
    assert torch.equal(got, _by_score_then_id(Q, twice, 5, ids=ids))
    assert ShardedMaxSimIndex.shard_range(10) == (0, 10)


def test_add_save_load_in_one_process(tmp_path):
    docs = _list_corpus(5, 5)
    index = ShardedMaxSimIndex.from_index(MaxSimIndex(docs, normalize=True), backend="torch")
    extra, extra_mask = _corpus(6, 3)
    assert index.add(extra, extra_mask).tolist() == [5, 6, 7]
    assert index.add(ids=torch.empty(0, dtype=torch.int64)).tolist() == []
    Q, q_mask = _queries()
    got = index.topk(Q, 8, q_mask)
    padded = torch.zeros(len(docs), extra.shape[1], DIM)
    for j, doc in enumerate(docs):
        padded[j, : len(doc)] = doc
    lengths = torch.tensor([len(d) for d in docs])
    whole = torch.cat([padded, extra])
    whole_mask = torch.cat([torch.arange(6) < lengths[:, None], extra_mask])
    assert _same(got, retrieve(Q, whole, 8, q_mask, whole_mask))
    path = index.save(tmp_path)
    assert os.path.basename(path) == "shard-00001-of-00001.pt"
    loaded = ShardedMaxSimIndex.load(tmp_path, backend="torch")
    assert _same(loaded.topk(Q, 8, q_mask), got) and loaded.add(extra[:1]).tolist() == [8]
    os.rename(path, tmp_path / "shard-00001-of-00002.pt")
    with pytest.raises(ValueError, match=r"holds shards of \[2\] ranks"):
        ShardedMaxSimIndex.load(tmp_path)


@pytest.mark.parametrize("kind", ["text", "truncated", "ids_missing", "ids_not_int64", "next_id"])
def test_loading_an_unreadable_shard_names_the_file(kind, tmp_path):
    path = ShardedMaxSimIndex.from_index(MaxSimIndex(_list_corpus(5, 3))).save(tmp_path)
    if kind == "text":
        with open(path, "w") as f:
            f.write("not a shard")
    elif kind == "truncated":
        with open(path, "rb") as f:
            head = f.read(300)
        with open(path, "wb") as f:
            f.write(head)
    else:
        state = torch.load(path, weights_only=True)
        if kind == "ids_missing":
            del state["ids"]
        elif kind == "ids_not_int64":
            state["ids"] = state["ids"].float()
        else:
            state["next_id"] = "3"
        torch.save(state, path)
    with pytest.raises(ValueError, match=re.escape(repr(path))) as caught:
        ShardedMaxSimIndex.load(tmp_path, backend="torch")
    if kind in ("text", "truncated", "ids_missing"):
        assert caught.value.__cause__ is not None


def test_bad_input_names_the_argument():
    D, mask = _corpus(0, 4)
    Q, _ = _queries()
    with pytest.raises(ValueError, match="documents must be a"):
        ShardedMaxSimIndex(D[0])
    with pytest.raises(ValueError, match="d_mask must be a bool tensor of shape"):
        ShardedMaxSimIndex(D, mask.float())
    with pytest.raises(ValueError, match="width d"):
        ShardedMaxSimIndex([D[0], D[1, :, :8]])
    with pytest.raises(TypeError, match="ids must be an int64 tensor"):
        ShardedMaxSimIndex(D, ids=torch.arange(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="ids must be distinct"):
        ShardedMaxSimIndex(D, ids=torch.tensor([0, 1, 1, 2]))
    with pytest.raises(ValueError, match="ids must lie in"):
        ShardedMaxSimIndex(D, ids=torch.tensor([0, 1, -1, 2]))
    with pytest.raises(ValueError, match="group= was given"):
        ShardedMaxSimIndex(D, group=object())
    index = ShardedMaxSimIndex(D, backend="torch")
    with pytest.raises(ValueError, match="Q has embedding width 8"):
        index.topk(Q[..., :8], 2)
    with pytest.raises(TypeError, match=r"Q must be torch\.float32"):
        index.topk(Q.double(), 2)
    with pytest.raises(TypeError, match="k must be an int"):
        index.topk(Q, 2.0)
    with pytest.raises(ValueError, match="q_mask must be a bool tensor of shape"):
        index.topk(Q, 2, torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"documents are torch\.float16"):
        index.add(D.half())
    with pytest.raises(ValueError, match="empty on every rank"):
        ShardedMaxSimIndex([]).topk(Q, 1)


def test_candidate_keys_order_scores_then_ids():
    scores = torch.tensor([[1.0, -2.0, 0.0, -0.0, float("nan"), 1.0, -float("inf"), 3e-39]])
    order = torch.tensor([[5, 0, 3, 2, 7, 1, 4, 6]])
    ranked = _keys(scores, order).argsort(dim=1, descending=True)[0].tolist()
    # NaN first (as torch.topk), equal scores (1.0, and 0.0 with -0.0) by smaller order
    assert ranked == [4, 5, 0, 7, 3, 2, 1, 6]
