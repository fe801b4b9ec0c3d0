"""``CompressedIndex`` in PyLate's retrieval pipeline: ``retrieve.ColBERT(index=...)`` with our
index in place of ``indexes.PLAID``, against PyLate's own exact reranking of every document."""

from __future__ import annotations

import pytest

pylate = pytest.importorskip("pylate")

import torch  # noqa: E402
from pylate import rank, retrieve  # noqa: E402

from late_interaction_kernels.integrations.pylate_index import CompressedIndex  # noqa: E402


def _embeddings(gen, n, lo, hi, dim=16):
    # non-negative unit vectors: every similarity is >= 0, as for a trained ColBERT encoder's. PyLate's
    # rank.rerank pads documents with zero vectors it does not mask, so a query token whose every
    # similarity is negative scores 0 there instead of its best (negative) similarity.
    return [
        torch.nn.functional.normalize(
            torch.randn(int(torch.randint(lo, hi, (1,), generator=gen)), dim, generator=gen).abs(), dim=-1
        ).numpy()
        for _ in range(n)
    ]


def test_retriever_with_compressed_index_matches_exact_rerank(tmp_path, seed):
    gen = torch.Generator().manual_seed(seed)
    docs = _embeddings(gen, 40, 2, 8)
    ids = [f"doc-{i}" for i in range(40)]
    index = CompressedIndex(index_folder=str(tmp_path), index_name="c", override=True, device="cpu",
                            n_centroids=8, keep_full="device", n_candidates=40, n_rerank=40)  # fmt: skip
    index.add_documents(documents_ids=ids[:30], documents_embeddings=docs[:30])
    index.add_documents(documents_ids=ids[30:], documents_embeddings=docs[30:])
    queries = _embeddings(gen, 3, 3, 6)
    results = retrieve.ColBERT(index=index).retrieve(queries_embeddings=queries, k=5)
    exact = rank.rerank(documents_ids=[ids] * 3, queries_embeddings=queries,
                        documents_embeddings=[docs] * 3)  # fmt: skip
    for got, want in zip(results, exact):
        # each place holds a document whose exact score is that place's: two documents within
        # float32 rounding of each other may come in either order (PyLate scores in float64)
        exact_score = {r["id"]: float(r["score"]) for r in want}
        assert len(got) == 5
        for a, b in zip(got, want):
            assert abs(exact_score[a["id"]] - float(b["score"])) < 1e-5
            assert abs(a["score"] - float(b["score"])) < 1e-4

    index.remove_documents([results[0][0]["id"]])
    again = retrieve.ColBERT(index=index).retrieve(queries_embeddings=queries[:1], k=5)
    assert results[0][0]["id"] not in [r["id"] for r in again[0]]
    reopened = CompressedIndex(index_folder=str(tmp_path), index_name="c", device="cpu",
                               n_candidates=40, n_rerank=40)  # fmt: skip
    assert len(reopened) == 39
    assert [r["id"] for r in reopened(queries[:1], k=5)[0]] == [r["id"] for r in again[0]]
