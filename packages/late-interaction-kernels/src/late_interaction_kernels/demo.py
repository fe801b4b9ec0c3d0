"""Demo: late-interaction reranking of a small synthetic collection.

Builds a collection of multi-vector documents (each a bag of noisy token embeddings around a few
topic directions), writes queries that paraphrase one document each (a subset of its topics with
fresh noise), scores every query against every document with :func:`maxsim`, and checks that each
query's own document ranks first. Runs on CPU in a few seconds through the PyTorch reference path
(on CUDA through the Triton kernels). The encoder-based demo lives with the model integrations.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import torch

from triton_dispatch import DemoResult, select_backend

from .ops.maxsim import maxsim


def make_collection(
    n_docs: int = 400,
    n_queries: int = 64,
    doc_len: int = 96,
    query_len: int = 16,
    dim: int = 64,
    n_topics: int = 3000,
    noise: float = 1.3,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(queries, docs, doc_mask, target)``: query ``i`` paraphrases document ``target[i]``;
    documents of varying length are padded to ``doc_len`` and masked by ``doc_mask``. Token
    embeddings are unit vectors; ``noise`` is the norm of the perturbation relative to a topic."""
    gen = torch.Generator().manual_seed(seed)
    topics = torch.nn.functional.normalize(torch.randn(n_topics, dim, generator=gen), dim=-1)
    doc_topics = torch.randint(0, n_topics, (n_docs, doc_len), generator=gen)
    docs = topics[doc_topics] + noise * torch.randn(n_docs, doc_len, dim, generator=gen) / dim**0.5
    lengths = torch.randint(doc_len // 3, doc_len + 1, (n_docs,), generator=gen)
    doc_mask = torch.arange(doc_len)[None, :] < lengths[:, None]
    # a query picks some of its document's (valid) tokens' topics and re-embeds them with new noise
    target = torch.randperm(n_docs, generator=gen)[:n_queries]
    picks = (torch.rand(n_queries, query_len, generator=gen) * lengths[target, None]).long()
    q_topics = doc_topics[target].gather(1, picks)
    queries = topics[q_topics] + noise * torch.randn(n_queries, query_len, dim, generator=gen) / dim**0.5
    docs = torch.nn.functional.normalize(docs, dim=-1)
    queries = torch.nn.functional.normalize(queries, dim=-1)
    return queries, docs, doc_mask, target


def colpali_loss_step(device: str) -> str:
    """One ``ColbertNegativeCELoss`` forward + backward with the colpali-engine patch applied, next
    to the unpatched value; a line saying it was skipped when colpali-engine is not installed."""
    if importlib.util.find_spec("colpali_engine") is None:
        return "colpali-engine not installed: patched loss step skipped"
    from importlib.metadata import version

    from colpali_engine.loss import late_interaction_losses as losses

    from .integrations import _patching, patch_colpali_engine, unpatch_colpali_engine

    found = version("colpali-engine")
    gen = torch.Generator().manual_seed(1)

    def tokens(*shape):
        return torch.nn.functional.normalize(torch.randn(*shape, generator=gen), dim=-1).to(device)

    q, d = tokens(4, 16, 64), tokens(4, 48, 64)
    # before 0.3.13 the negative losses took one negative per query
    n = tokens(4, 48, 64) if _patching._release(found) < (0, 3, 13) else tokens(4, 2, 48, 64)
    loss_fn = losses.ColbertNegativeCELoss()
    with torch.no_grad():
        unpatched = float(loss_fn(q, d, n))
    try:
        patch_colpali_engine()
    except _patching.UnsupportedVersionError as exc:
        return f"colpali-engine {found}: {exc}"
    try:
        q.requires_grad_()
        start = time.perf_counter()
        loss = loss_fn(q, d, n)
        loss.backward()
        elapsed_ms = (time.perf_counter() - start) * 1e3
    finally:
        unpatch_colpali_engine()
    route = "fused kernels" if _patching.routes_to_kernels(q, d) else "colpali-engine's own code"
    return (
        f"colpali-engine {found} ColbertNegativeCELoss step, patched: loss {loss.detach().item():.6f} "
        f"(unpatched {unpatched:.6f}), forward+backward {elapsed_ms:.0f} ms through {route}"
    )


def run_demo(output_dir: Path) -> DemoResult:
    """Score and rerank the synthetic collection; write the top-5 of each query as JSON."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    queries, docs, doc_mask, target = (t.to(device) for t in make_collection())
    backend = select_backend(queries, docs)
    maxsim(queries[:2], docs[:4], d_mask=doc_mask[:4])  # warm-up (compilation/autotune on GPU)
    start = time.perf_counter()
    with torch.no_grad():
        scores = maxsim(queries, docs, d_mask=doc_mask)
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed_ms = (time.perf_counter() - start) * 1e3
    top = scores.topk(5, dim=-1)
    recall_at_1 = (top.indices[:, 0] == target).float().mean().item()
    mrr = (1.0 / (scores > scores.gather(1, target[:, None])).sum(1).add(1).float()).mean().item()
    # what a single-vector retriever sees: mean-pooled tokens, cosine similarity
    pooled_d = torch.nn.functional.normalize((docs * doc_mask[..., None]).sum(1), dim=-1)
    pooled_q = torch.nn.functional.normalize(queries.sum(1), dim=-1)
    pooled_recall = ((pooled_q @ pooled_d.T).argmax(-1) == target).float().mean().item()
    colpali_line = colpali_loss_step(device)
    print(colpali_line)
    path = output_dir / "late_interaction_rerank.json"
    path.write_text(
        json.dumps(
            {
                "queries": queries.shape[0],
                "documents": docs.shape[0],
                "recall_at_1": recall_at_1,
                "mrr": mrr,
                "mean_pooled_recall_at_1": pooled_recall,
                "score_ms": elapsed_ms,
                "backend": backend,
                "colpali_loss_step": colpali_line,
                "top5": top.indices[:20].tolist(),
            },
            indent=1,
        )
    )
    n_q, n_d = queries.shape[0], docs.shape[0]
    return DemoResult(
        summary=f"MaxSim rerank of {n_q} queries x {n_d} documents ({queries.shape[1]}x{docs.shape[1]} tokens, d={docs.shape[2]}) in {elapsed_ms:.0f} ms",
        backend=backend,
        key_figure=f"recall@1 {recall_at_1:.3f} (mean-pooled single vector: {pooled_recall:.3f})",
        outputs=[path],
    )


if __name__ == "__main__":
    result = run_demo(Path("demo-output"))
    print(result.summary, "|", result.key_figure, "|", result.backend)
