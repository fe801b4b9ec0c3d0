"""ShardedCompressedIndex: two gloo ranks (interpreted kernels) each compress their shard; with
every document a candidate and the exact rerank, the merged top-k equals exact MaxSim over the
whole collection in one process, before and after an add, a delete and a save / load."""

from __future__ import annotations

import tempfile

import torch

from late_interaction_kernels import MaxSimIndex, ShardedCompressedIndex
from triton_dispatch.testing import run_ranks

DIM = 16
SEARCH = {"n_probe": 4, "n_candidates": 64, "n_rerank": 64}


def _docs(seed: int, n: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.functional.normalize(torch.randn(1 + i % 5, DIM, generator=g), dim=-1) for i in range(n)]


def _queries():
    g = torch.Generator().manual_seed(7)
    return torch.nn.functional.normalize(torch.randn(3, 4, DIM, generator=g), dim=-1)


def sharded_compressed_checks(rank: int, world: int, directory: str) -> dict:
    docs = _docs(0, 20)
    mine = docs[:12] if rank == 0 else docs[12:]
    index = ShardedCompressedIndex(mine, n_centroids=4, kmeans_iters=2)
    Q = _queries()
    out = {"first": index.search(Q, 5, **SEARCH), "len": len(index)}
    extra = _docs(1, 6)
    out["new_ids"] = index.add(extra[:3] if rank == 0 else extra[3:]).tolist()
    out["after_add"] = index.search(Q, 5, **SEARCH)
    index.delete(out["after_add"][1][:, 0].unique())
    out["after_delete"] = index.search(Q, 5, **SEARCH)
    index.save(directory)
    loaded = ShardedCompressedIndex.load(directory)
    out["loaded"] = loaded.search(Q, 5, **SEARCH)
    try:
        index.delete([999])
    except ValueError as exc:
        out["bad_delete"] = str(exc)
    return out


def test_sharded_compressed_matches_one_process():
    with tempfile.TemporaryDirectory() as directory:
        results = run_ranks(sharded_compressed_checks, 2, directory, timeout=600)
    Q = _queries()
    docs = _docs(0, 20)
    extra = _docs(1, 6)
    want_first = MaxSimIndex(docs).topk(Q, 5)
    whole = docs + extra
    want_add = MaxSimIndex(whole).topk(Q, 5)
    deleted = set(want_add[1][:, 0].tolist())
    keep = [i for i in range(len(whole)) if i not in deleted]
    s, local = MaxSimIndex([whole[i] for i in keep]).topk(Q, 5)
    want_delete = (s, torch.tensor(keep)[local])
    for out in results:
        assert out["len"] == 20
        for got, want in ((out["first"], want_first), (out["after_add"], want_add),
                          (out["after_delete"], want_delete), (out["loaded"], want_delete)):  # fmt: skip
            assert torch.equal(got[1], want[1])
            torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-4)
        assert "no rank holds" in out["bad_delete"]
    # ids: rank 0's documents first, new ones after the largest
    assert results[0]["new_ids"] == [20, 21, 22] and results[1]["new_ids"] == [23, 24, 25]
