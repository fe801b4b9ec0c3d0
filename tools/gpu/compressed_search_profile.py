"""Where a single query's time goes in ``CompressedMaxSimIndex.search``: host time per op, GPU time
per kernel and the host synchronisations, from ``torch.profiler`` over warm one-query calls on
``retrieval.py``'s corpus. Writes ``$OUT/compressed-profile-<docs>.json`` and prints the tables.

    PYTHONPATH=shared/triton-dispatch/src:packages/late-interaction-kernels/src \\
        python3 tools/gpu/compressed_search_profile.py --docs 100000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packages/late-interaction-kernels/benchmarks"))

from retrieval import make_corpus, make_queries  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--docs", type=int, default=100_000)
    p.add_argument("--calls", type=int, default=50)
    args = p.parse_args()
    from late_interaction_kernels import CompressedMaxSimIndex

    device = torch.device("cuda")
    tokens, lengths, topics = make_corpus(args.docs, device)
    queries, _ = make_queries(tokens, lengths, topics, 64, device)
    index = CompressedMaxSimIndex.build(tokens, lengths.cpu(), device=device)
    del tokens
    for i in range(10):
        index.search(queries[i : i + 1], 10)
    torch.cuda.synchronize()
    walls = []
    for i in range(args.calls):
        t0 = time.perf_counter()
        index.search(queries[i % 64 : i % 64 + 1], 10)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for i in range(20):
            index.search(queries[i : i + 1], 10)
        torch.cuda.synchronize()
    ev = prof.key_averages()
    rows = [
        {
            "name": e.key,
            "count": e.count,
            "self_cpu_us": e.self_cpu_time_total / 20,
            "cpu_us": e.cpu_time_total / 20,
            "device_us": getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) / 20,
        }
        for e in ev
    ]
    by_cpu = sorted(rows, key=lambda r: -r["self_cpu_us"])[:40]
    by_dev = sorted(rows, key=lambda r: -r["device_us"])[:20]
    result = {
        "docs": args.docs,
        "single_ms_median": 1e3 * statistics.median(walls),
        "single_ms_min": 1e3 * min(walls),
        "per_call_by_self_cpu": by_cpu,
        "per_call_by_device": by_dev,
        "device": torch.cuda.get_device_name(),
    }
    out = Path(os.environ.get("OUT", ".")) / f"compressed-profile-{args.docs}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"single query: median {result['single_ms_median']:.3f} ms, min {result['single_ms_min']:.3f} ms")
    print("per call, by host self time (us):")
    for r in by_cpu:
        print(f"  {r['self_cpu_us']:8.1f} cpu  {r['device_us']:8.1f} dev  x{r['count'] / 20:4.1f}  {r['name'][:90]}")
    print("per call, by device time (us):")
    for r in by_dev:
        print(f"  {r['device_us']:8.1f} dev  x{r['count'] / 20:4.1f}  {r['name'][:90]}")


if __name__ == "__main__":
    main()
