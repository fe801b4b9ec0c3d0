"""Search a large collection: our exact ``MaxSimIndex``, our compressed ``CompressedMaxSimIndex`` and
fast-plaid (LightOn's GPU PLAID engine) on the same synthetic corpus, each in its own process.

    PYTHONPATH=shared/triton-dispatch/src:packages/late-interaction-kernels/src \\
    python3 packages/late-interaction-kernels/benchmarks/retrieval.py \\
        --docs 100000 1000000 --systems exact compressed fast-plaid --out retrieval.json

    # a CPU check that the script runs (interpreted kernels, a tiny corpus)
    TRITON_INTERPRET=1 python packages/late-interaction-kernels/benchmarks/retrieval.py \\
        --docs 300 --queries 4 --systems exact compressed --tiny --out x.json

The corpus (:func:`make_corpus`, seeded, generated block by block on the device so that every
process sees the same tokens): 128-dim unit tokens drawn around a vocabulary of "word" vectors,
themselves grouped under topics, the way a trained ColBERT encoder's token embeddings cluster
by term. ``TOPICS`` topic directions; each word sits at a random angle of about 45 degrees from
its topic; a document of 32-128 tokens (uniform) draws its tokens from the words of two topics
and adds noise. A query (:func:`make_queries`, 32 tokens) is written for one document of the
collection: each token is a noisy copy of one of that document's tokens (half of them) or of a
word of its topics (the other half), so the document it was written for, and the ones that share
its topics and words, score highest, as in a real relevance set.

Every worker builds its index, answers the 256 queries at once (``QPS``: median of 3 timed
batches after a warm one, host-timed with a synchronize), answers single queries (the median of
``SINGLE`` one-query calls), and reports build time, GPU memory (the index's allocation after the
build, and the peak during search over the index), host memory (resident set growth), and its
top-k ids. The parent computes recall@k of every system against the exact index's answers
(``recall@10``: the share of the exact top-10 ids each system returns in its top 10).
fast-plaid runs with its defaults and with larger probe / full-score settings (the setting that
matches our recall is the one reported beside ours).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

DIM = 128
TOPICS = 4096
WORDS_PER_TOPIC = 16
MIN_LEN, MAX_LEN = 32, 128
QUERY_LEN = 32
SEED = 20261207
#: Documents generated per block (each block seeded by its position).
BLOCK = 20_000
SINGLE = 20
#: fast-plaid settings: its defaults first, then wider searches.
FAST_PLAID_SETTINGS = [
    {"n_ivf_probe": 8, "n_full_scores": 4096},
    {"n_ivf_probe": 16, "n_full_scores": 8192},
    {"n_ivf_probe": 32, "n_full_scores": 16384},
    {"n_ivf_probe": 64, "n_full_scores": 32768},
]


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def vocabulary(device, dim: int = DIM) -> tuple[torch.Tensor, torch.Tensor]:
    """``(topics (TOPICS, dim), words (TOPICS * WORDS_PER_TOPIC, dim))``, unit vectors; word
    ``w`` belongs to topic ``w // WORDS_PER_TOPIC``."""
    gen = torch.Generator(device=device).manual_seed(SEED)
    topics = _unit(torch.randn(TOPICS, dim, generator=gen, device=device))
    offsets = _unit(torch.randn(TOPICS, WORDS_PER_TOPIC, dim, generator=gen, device=device))
    words = _unit(topics[:, None, :] + offsets).reshape(-1, dim)
    return topics, words


def make_corpus(n_docs: int, device, dim: int = DIM) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tokens fp16 (total, dim), lengths int64 (n_docs,), topics int64 (n_docs, 2))`` of the
    collection, on ``device``. Block ``b`` of ``BLOCK`` documents comes from seed ``SEED + b``."""
    _, words = vocabulary(device, dim)
    parts, lengths, doc_topics = [], [], []
    for b in range((n_docs + BLOCK - 1) // BLOCK):
        n = min(BLOCK, n_docs - b * BLOCK)
        gen = torch.Generator(device=device).manual_seed(SEED + 1 + b)
        length = torch.randint(MIN_LEN, MAX_LEN + 1, (n,), generator=gen, device=device)
        topic = torch.randint(0, TOPICS, (n, 2), generator=gen, device=device)
        total = int(length.sum())
        owner = torch.repeat_interleave(torch.arange(n, device=device), length)
        pick = torch.randint(0, 2, (total,), generator=gen, device=device)
        word = topic[owner, pick] * WORDS_PER_TOPIC + torch.randint(
            0, WORDS_PER_TOPIC, (total,), generator=gen, device=device
        )
        noise = torch.randn(total, dim, generator=gen, device=device) * (0.35 / dim**0.5)
        parts.append(_unit(words[word] + noise).half())
        lengths.append(length)
        doc_topics.append(topic)
        del owner, pick, word, noise
    return torch.cat(parts), torch.cat(lengths), torch.cat(doc_topics)


def make_queries(tokens, lengths, doc_topics, n_queries: int, device, dim: int = DIM):
    """``(queries fp16 (n_queries, QUERY_LEN, dim), targets int64 (n_queries,))``: each query is
    written for the document ``targets[i]``."""
    _, words = vocabulary(device, dim)
    gen = torch.Generator(device=device).manual_seed(SEED - 1)
    targets = torch.randint(0, lengths.shape[0], (n_queries,), generator=gen, device=device)
    starts = torch.cumsum(lengths, 0) - lengths
    q = torch.empty(n_queries, QUERY_LEN, dim, device=device)
    for i, t in enumerate(targets.tolist()):
        n = int(lengths[t])
        rows = torch.randint(0, n, (QUERY_LEN // 2,), generator=gen, device=device)
        copied = tokens[int(starts[t]) + rows].float()
        topic = doc_topics[t][torch.randint(0, 2, (QUERY_LEN - QUERY_LEN // 2,), generator=gen, device=device)]
        word = words[topic * WORDS_PER_TOPIC + torch.randint(
            0, WORDS_PER_TOPIC, topic.shape, generator=gen, device=device)]  # fmt: skip
        base = torch.cat([copied, word])
        q[i] = _unit(base + torch.randn(QUERY_LEN, dim, generator=gen, device=device) * (0.5 / dim**0.5))
    return q.half(), targets


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _time_calls(fn, device, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        out.append(time.perf_counter() - t0)
    return out


def _measure_search(search, queries, k, device, repeats=3, single=SINGLE) -> dict:
    """QPS of all queries at once, single-query latency, search peak memory, and the ids."""
    cuda = torch.device(device).type == "cuda"
    t0 = time.perf_counter()
    ids = search(queries, k)
    _sync(device)
    first = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        held = torch.cuda.memory_allocated(device)
    batch = _time_calls(lambda: search(queries, k), device, repeats)
    peak = torch.cuda.max_memory_allocated(device) - held if cuda else 0
    n_single = min(single, queries.shape[0])
    one = _time_calls(lambda: None, device, 0)
    for i in range(n_single):
        one += _time_calls(lambda i=i: search(queries[i : i + 1], k), device, 1)
    batch_s = statistics.median(batch)
    return {
        "ids": ids,
        "first_batch_s": first,
        "batch_s": batch_s,
        "qps": queries.shape[0] / batch_s,
        "single_ms": 1e3 * statistics.median(one[1:] if len(one) > 1 else one),
        "search_peak_bytes": peak,
    }


def _corpus(args, device):
    tokens, lengths, topics = make_corpus(args.docs[0], device, args.dim)
    queries, targets = make_queries(tokens, lengths, topics, args.queries, device, args.dim)
    return tokens, lengths, queries, targets


def _worker_exact(args, device) -> dict:
    from late_interaction_kernels import MaxSimIndex

    tokens, lengths, queries, _ = _corpus(args, device)
    # padded with a mask: the index's fast layout (a list is padded chunk by chunk at every call)
    width = int(lengths.max())
    padded = torch.zeros(lengths.shape[0], width, tokens.shape[1], dtype=tokens.dtype, device=device)
    mask = torch.arange(width, device=device)[None, :] < lengths[:, None]
    padded[mask] = tokens
    del tokens
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    t0 = time.perf_counter()
    index = MaxSimIndex(padded, mask)
    _sync(device)
    build = time.perf_counter() - t0

    def search(q, k):
        return index.topk(q, min(k, len(index)))[1]

    res = _measure_search(search, queries, args.k, device)
    res.update(build_s=build, index_bytes=padded.numel() * padded.element_size(),
               gpu_alloc_after_build=(torch.cuda.memory_allocated(device) - before) if device.type == "cuda" else 0)  # fmt: skip
    return res


def _worker_compressed(args, device) -> dict:
    from late_interaction_kernels import CompressedMaxSimIndex

    tokens, lengths, queries, _ = _corpus(args, device)
    host_tokens = tokens.cpu() if args.host_input else tokens
    del tokens
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    rss0 = _rss_bytes()
    options = json.loads(args.options) if args.options else {}
    t0 = time.perf_counter()
    index = CompressedMaxSimIndex.build(host_tokens, lengths.cpu(), device=device, **options)
    _sync(device)
    build = time.perf_counter() - t0
    alloc = (torch.cuda.memory_allocated(device) - before) if device.type == "cuda" else 0
    out = {"build_s": build, "gpu_alloc_after_build": alloc, "host_rss_growth": _rss_bytes() - rss0,
           "index_bytes": index.nbytes(), "options": options, "settings": []}  # fmt: skip
    _progress("compressed", out)
    for setting in json.loads(args.search_settings or "[{}]"):

        def search(q, k, setting=setting):
            return index.search(q, k, **setting)[1]

        res = _measure_search(search, queries, args.k, device)
        res["setting"] = setting
        out["settings"].append(res)
        _progress("compressed", res)
    if args.add_check:
        del index
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        out["add"] = _add_check(host_tokens, lengths, queries, args.k, device, options,
                                out["settings"][0]["setting"], out["settings"][0]["ids"])  # fmt: skip
        _progress("compressed add", out["add"])
    return out


def _progress(system: str, entry: dict) -> None:
    """One line per measurement as it is taken, so that a run cut short still reports it."""
    shown = {k: v for k, v in entry.items() if isinstance(v, (int, float, str, dict))}
    print(f"[{system}] {json.dumps(shown)}", file=sys.stderr, flush=True)


def _add_check(tokens, lengths, queries, k, device, options, setting, full_ids) -> dict:
    """Build on the first 99 % of the documents, add the last 1 %: the add's time, and the share
    of the full build's top-k the grown index returns; then delete every query's best document
    and count how many deleted ids come back."""
    n_keep = lengths.shape[0] - max(1, lengths.shape[0] // 100)
    cut = int(lengths[:n_keep].sum())
    t0 = time.perf_counter()
    part = _build_compressed(tokens[:cut], lengths[:n_keep].cpu(), device, options)
    _sync(device)
    build_99 = time.perf_counter() - t0
    t0 = time.perf_counter()
    part.add(tokens[cut:], lengths[n_keep:].cpu())
    _sync(device)
    add_s = time.perf_counter() - t0
    ids = part.search(queries, k, **setting)[1].cpu()
    agree = _recall(ids, full_ids.cpu(), k)
    gone = ids[:, 0].unique()
    part.delete(gone)
    after = part.search(queries, k, **setting)[1].cpu()
    return {"build_99_s": build_99, "add_1pct_s": add_s, "add_over_build": add_s / build_99,
            "topk_agreement_with_full_build": agree, "ids_equal_rows": int((ids == full_ids.cpu()).all(1).sum()),
            "deleted_returned": int(torch.isin(after, gone).sum()), "deleted": int(gone.numel())}  # fmt: skip


def _build_compressed(tokens, lengths, device, options):
    from late_interaction_kernels import CompressedMaxSimIndex

    return CompressedMaxSimIndex.build(tokens, lengths, device=device, **options)


def _worker_fast_plaid(args, device) -> dict:
    from fast_plaid import search as fp_search

    tokens, lengths, queries, _ = _corpus(args, device)
    docs = list(tokens.cpu().split(lengths.tolist()))
    del tokens
    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    free_before = torch.cuda.mem_get_info(device)[0]
    rss0 = _rss_bytes()
    folder = tempfile.mkdtemp(prefix="fast-plaid-")
    t0 = time.perf_counter()
    index = fp_search.FastPlaid(index=folder, device=str(device))
    index.create(documents_embeddings=docs, nbits=args.nbits)
    _sync(device)
    build = time.perf_counter() - t0
    out = {
        "build_s": build,
        "gpu_alloc_after_build": torch.cuda.memory_allocated(device) - before,
        "gpu_used_after_build": free_before - torch.cuda.mem_get_info(device)[0],
        "host_rss_growth": _rss_bytes() - rss0,
        "index_bytes": sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)),
        "settings": [],
    }
    q_cpu = queries.cpu()
    for setting in json.loads(args.fast_plaid_settings) if args.fast_plaid_settings else FAST_PLAID_SETTINGS:

        def search(q, k, setting=setting):
            hits = index.search(q, top_k=k, show_progress=False, **setting)
            ids = torch.full((len(hits), k), -1, dtype=torch.int64)
            for i, row in enumerate(hits):
                for j, (doc, _score) in enumerate(row[:k]):
                    ids[i, j] = doc
            return ids

        res = _measure_search(search, q_cpu, args.k, device)
        res["setting"] = setting
        out["settings"].append(res)
    return out


WORKERS = {"exact": _worker_exact, "compressed": _worker_compressed, "fast-plaid": _worker_fast_plaid}


def _run_worker(args) -> None:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(0)
    result = WORKERS[args.worker](args, device)
    ids = {}
    for i, entry in enumerate([result, *result.get("settings", [])]):
        if "ids" in entry:
            ids[i] = entry.pop("ids").cpu()
    torch.save(ids, args.ids_file)
    result["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    with open(args.result_file, "w") as f:
        json.dump(result, f)


def _recall(ids: torch.Tensor, exact: torch.Tensor, k: int) -> float:
    hits = 0
    for row, truth in zip(ids.tolist(), exact.tolist()):
        hits += len(set(row[:k]) & set(truth[:k]))
    return hits / (exact.shape[0] * k)


def _spawn(args, system: str, n_docs: int, workdir: str, options: str = "") -> tuple[dict, dict]:
    base = os.path.join(workdir, f"{system}-{n_docs}-{abs(hash(options))}")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", system, "--docs", str(n_docs),
           "--queries", str(args.queries), "--k", str(args.k), "--dim", str(args.dim),
           "--nbits", str(args.nbits), "--result-file", base + ".json", "--ids-file", base + ".pt"]  # fmt: skip
    if options:
        cmd += ["--options", options]
    if args.search_settings:
        cmd += ["--search-settings", args.search_settings]
    if args.fast_plaid_settings:
        cmd += ["--fast-plaid-settings", args.fast_plaid_settings]
    for flag in ("host_input", "tiny", "add_check"):
        if getattr(args, flag):
            cmd += ["--" + flag.replace("_", "-")]
    if args.device:
        cmd += ["--device", args.device]
    t0 = time.perf_counter()
    # the worker's stderr is echoed as it comes (its progress lines) and its tail kept for errors
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    tail = ""
    for line in proc.stderr:
        sys.stderr.write(line)
        tail = (tail + line)[-3000:]
    if proc.wait() != 0:
        return {"error": tail, "wall_s": time.perf_counter() - t0}, {}
    with open(base + ".json") as f:
        result = json.load(f)
    result["wall_s"] = time.perf_counter() - t0
    return result, torch.load(base + ".pt")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--systems", nargs="+", default=["exact", "compressed", "fast-plaid"])
    p.add_argument("--queries", type=int, default=256)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--dim", type=int, default=DIM)
    p.add_argument("--nbits", type=int, default=4, help="fast-plaid's residual bits")
    p.add_argument("--options", default="",
                   help="JSON: CompressedMaxSimIndex.build options, or a list of option sets")
    p.add_argument("--search-settings", default="", help="JSON list of search() keyword sets")
    p.add_argument("--fast-plaid-settings", default="",
                   help="JSON list of fast-plaid search settings (default: its defaults, then wider ones)")
    p.add_argument("--host-input", action="store_true", help="build ours from host tokens")
    p.add_argument("--tiny", action="store_true", help="small vocabulary for a CPU check")
    p.add_argument("--add-check", action="store_true",
                   help="ours: build on 99 %%, add 1 %%, compare with the full build, delete")
    p.add_argument("--device", default="")
    p.add_argument("--out", default="retrieval.json")
    p.add_argument("--worker", default="")
    p.add_argument("--result-file", default="")
    p.add_argument("--ids-file", default="")
    args = p.parse_args()
    if args.tiny:
        global TOPICS, BLOCK, SINGLE
        TOPICS, BLOCK, SINGLE = 16, 100, 2
    if args.worker:
        _run_worker(args)
        return
    workdir = tempfile.mkdtemp(prefix="retrieval-")
    report = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "runs": []}
    for n_docs in args.docs:
        exact_ids = None
        runs = []
        for system in args.systems:
            if system == "compressed" and args.options:
                # one build per option set: a JSON object or a list of them
                sets = json.loads(args.options)
                runs += [(system, json.dumps(o)) for o in (sets if isinstance(sets, list) else [sets])]
            else:
                runs.append((system, ""))
        for system, options in runs:
            result, ids = _spawn(args, system, n_docs, workdir, options)
            if system == "exact" and 0 in ids:
                exact_ids = ids[0]
            entries = [result, *result.get("settings", [])]
            for i, entry in enumerate(entries):
                if i in ids and exact_ids is not None:
                    entry["recall_at_k"] = _recall(ids[i], exact_ids, args.k)
            result.update(system=system, docs=n_docs)
            report["runs"].append(result)
            print(_summary(result), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


def _summary(r: dict) -> str:
    if "error" in r:
        return f"{r['system']:>11} {r['docs']:>9}: ERROR {r['error'][-1500:]}"
    lines = [f"{r['system']:>11} {r['docs']:>9} {json.dumps(r.get('options', ''))}: build {r.get('build_s', 0):.1f} s, "
             f"gpu {r.get('gpu_alloc_after_build', 0) / 2**30:.2f} GiB, "
             f"index {r.get('index_bytes', 0) / 2**30:.2f} GiB"]  # fmt: skip
    for e in [r, *r.get("settings", [])]:
        if "qps" in e:
            lines.append(
                f"    {json.dumps(e.get('setting', {}))}: QPS {e['qps']:.0f}, 1-query "
                f"{e['single_ms']:.2f} ms, recall@k {e.get('recall_at_k', float('nan')):.4f}, "
                f"search peak {e['search_peak_bytes'] / 2**30:.2f} GiB, first {e['first_batch_s']:.2f} s"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
