"""Exact top-k search over a collection split across GPUs (``ShardedMaxSimIndex``): queries per
second, first-call time, memory per GPU, and agreement with a float64 ranking.

    PYTHONPATH=shared/triton-dispatch/src:packages/late-interaction-kernels/src \\
    python3 -m torch.distributed.run --nproc_per_node=2 \\
        packages/late-interaction-kernels/benchmarks/sharded_retrieval.py --mode speed --out s.json

    # on a CPU, interpreted kernels and gloo, tiny shapes (checks that the script runs)
    TRITON_INTERPRET=1 python -m torch.distributed.run --nproc_per_node=2 \\
        packages/late-interaction-kernels/benchmarks/sharded_retrieval.py --tiny --out x.json

Modes (NCCL, one GPU per rank, bf16, unit-norm tokens, ``normalize=False``):

* ``speed``: 200,000 documents of 300 tokens, d 128 (15.4 GB: fits one GPU), queries of 32
  tokens, k 100, batches of 32 queries and of 1 query (the fused kernel). Each rank generates its
  slice of one global collection (blocks of documents seeded by their global position), so runs
  with 1 and 2 GPUs search the same collection; compare their ``ids_checksum``.
* ``big``: 1,500,000 documents of 300 tokens, d 128 (115.2 GB: 57.6 GB per GPU on two GPUs),
  generated and normalised in place block by block. A batch of 32 queries is timed, and the top
  100 of 4 queries is checked against a float64 ranking computed block by block on the GPUs: the
  float64 score of the ``j``-th returned document must equal the ``j``-th best float64 score
  within 1e-6 relative (documents may swap only where their scores are that close).

Timings: ``topk`` is a collective, so every rank must run it the same number of times, and
``triton.testing.do_bench`` picks its count per process. So each call runs a fixed number of
times on every rank as ``do_bench`` does (L2 flushed, CUDA events around each call, median):
``gpu_ms``; ``wall_ms`` is a back-to-back loop timed on the host with a synchronize after each
call (what a server answering one batch at a time sees); ``first_call_s`` is the first call of a
fresh process (kernel compiles included). ``local_only_ms`` is one rank's fused top-k over its
shard without the exchange (``do_bench``). Peak memory is ``torch.cuda.max_memory_allocated`` per
rank over the whole run (generation, timing and the float64 check included), also less the
shard; ``topk_workspace_bytes`` is what one ``topk`` call allocates beyond what was held before.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from late_interaction_kernels import ShardedMaxSimIndex
from late_interaction_kernels.ops.maxsim_topk import maxsim_topk
from triton_dispatch.bench import synchronize

SHAPES = {
    "speed": {"docs": 200_000, "ld": 300, "dim": 128, "lq": 32, "k": 100, "batches": (32, 1)},
    "big": {"docs": 1_500_000, "ld": 300, "dim": 128, "lq": 32, "k": 100, "batches": (32,)},
    "tiny": {"docs": 40, "ld": 6, "dim": 16, "lq": 4, "k": 5, "batches": (3, 1)},
}
#: Documents generated (and scored in float64) per block.
BLOCK = 1000
CHECK_QUERIES = 4
SEED = 1234


def _generate_shard(n_docs: int, ld: int, dim: int, dtype, device) -> tuple[torch.Tensor, int]:
    """This rank's slice of the global collection, made in place: block ``b`` of the collection
    comes from seed ``SEED + b`` whatever the world size, and is normalised before it is stored,
    so no full-size temporary exists."""
    lo, hi = ShardedMaxSimIndex.shard_range(n_docs)
    shard = torch.empty(hi - lo, ld, dim, dtype=dtype, device=device)
    gen = torch.Generator(device=device)
    for b in range(lo // BLOCK, (hi + BLOCK - 1) // BLOCK):
        gen.manual_seed(SEED + b)
        block = torch.randn(BLOCK, ld, dim, generator=gen, device=device)
        block /= block.norm(dim=-1, keepdim=True)
        first, last = max(lo, b * BLOCK), min(hi, (b + 1) * BLOCK)
        shard[first - lo : last - lo] = block[first - b * BLOCK : last - b * BLOCK]
        del block
    return shard, lo


def _queries(nq: int, lq: int, dim: int, dtype, device, seed: int) -> torch.Tensor:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    Q = torch.randn(nq, lq, dim, generator=gen, device=device)
    return (Q / Q.norm(dim=-1, keepdim=True)).to(dtype)


def _fixed_bench(fn, device, calls: int) -> float:
    """Median ms of ``calls`` calls, each between CUDA events after an L2 flush (the host's clock
    on a CPU); the same count on every rank."""
    if device.type != "cuda":
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    for start, end in zip(starts, ends):
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def _wall_ms(fn, device, calls: int) -> float:
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
        synchronize(device)
    return (time.perf_counter() - start) / calls * 1e3


def _local_only_ms(Q, shard, k, device) -> float | None:
    if shard.shape[0] == 0:
        return None
    fn = functools.partial(maxsim_topk, Q, shard, min(k, shard.shape[0]))
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, return_mode="median"))
    return _fixed_bench(fn, device, 3)


def _float64_check(shard, lo, Q, k, got_scores, got_ids, device) -> dict:
    """Each rank scores its shard in float64 block by block; the best ``k`` per query are merged
    over the ranks and compared with what ``topk`` returned."""
    nq = Q.shape[0]
    Q64 = Q.double()
    best_s = torch.empty(nq, 0, dtype=torch.float64, device=device)
    best_i = torch.empty(nq, 0, dtype=torch.int64, device=device)
    got_s64 = torch.zeros(nq, k, dtype=torch.float64, device=device)
    local_ids = got_ids - lo
    mine = (local_ids >= 0) & (local_ids < shard.shape[0])
    for start in range(0, shard.shape[0], BLOCK):
        D64 = shard[start : start + BLOCK].double()
        s = torch.einsum("qld,ntd->qnlt", Q64, D64).amax(dim=3).sum(dim=2)  # (nq, n)
        ids = torch.arange(lo + start, lo + start + s.shape[1], device=device).expand_as(s)
        best_s, where = torch.cat([best_s, s], dim=1).topk(min(k, best_s.shape[1] + s.shape[1]))
        best_i = torch.cat([best_i, ids], dim=1).gather(1, where)
        here = mine & (local_ids >= start) & (local_ids < start + s.shape[1])
        rows, cols = here.nonzero(as_tuple=True)
        got_s64[rows, cols] = s[rows, local_ids[rows, cols] - start]
        del D64, s
    pad = k - best_s.shape[1]
    best_s = torch.nn.functional.pad(best_s, (0, pad), value=float("-inf"))
    best_i = torch.nn.functional.pad(best_i, (0, pad), value=-1)
    if dist.get_world_size() > 1:
        every_s = [torch.empty_like(best_s) for _ in range(dist.get_world_size())]
        every_i = [torch.empty_like(best_i) for _ in range(dist.get_world_size())]
        dist.all_gather(every_s, best_s)
        dist.all_gather(every_i, best_i)
        best_s, where = torch.cat(every_s, dim=1).topk(k)
        best_i = torch.cat(every_i, dim=1).gather(1, where)
        dist.all_reduce(got_s64)
    rel = ((got_s64 - best_s).abs() / best_s.abs().clamp_min(1e-30)).max().item()
    return {
        "queries_checked": nq,
        "ids_equal_fraction": (got_ids == best_i).double().mean().item(),
        "max_relative_score_gap": rel,
        "float32_vs_float64_max_abs": (got_scores.double() - got_s64).abs().max().item(),
        "ranking_ok": rel < 1e-6,
    }


def _checksum(ids: torch.Tensor) -> int:
    """One number per result set, the same for equal ids in equal order (for runs on 1 and N
    GPUs)."""
    weights = torch.arange(1, ids.numel() + 1, device=ids.device, dtype=torch.float64)
    return int((ids.double().flatten() * weights).sum().item())


def _gather_floats(values: list[float], device) -> list[list[float]]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [o.tolist() for o in out]


def run(mode: str, tiny: bool, device, dtype, calls: int) -> dict:
    shape = SHAPES["tiny" if tiny else mode]
    n_docs, ld, dim, lq, k = (shape[key] for key in ("docs", "ld", "dim", "lq", "k"))
    world = dist.get_world_size()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        need = n_docs * ld * dim * 2 / world
        free = torch.cuda.mem_get_info(device)[0]
        if need > free:
            raise SystemExit(
                f"{mode}: a shard needs {need / 1e9:.1f} GB and this GPU has {free / 1e9:.1f} GB "
                f"free; run with more GPUs (--nproc_per_node)"
            )
    run_peak = 0
    start = time.perf_counter()
    shard, lo = _generate_shard(n_docs, ld, dim, dtype, device)
    synchronize(device)
    generate_s = time.perf_counter() - start
    index = ShardedMaxSimIndex(shard, normalize=False)
    shard_bytes = shard.numel() * shard.element_size()
    record: dict = {
        "mode": "tiny" if tiny else mode,
        "world_size": world,
        "documents": n_docs,
        "Ld": ld,
        "d": dim,
        "Lq": lq,
        "k": k,
        "dtype": str(dtype),
        "generate_s": generate_s,
        "cases": [],
    }
    for i, nq in enumerate(shape["batches"]):
        Q = _queries(nq, lq, dim, dtype, device, seed=SEED + 10**6 + i)
        synchronize(device)
        dist.barrier()
        t0 = time.perf_counter()
        scores, ids = index.topk(Q, k)
        synchronize(device)
        first = time.perf_counter() - t0
        fn = functools.partial(index.topk, Q, k)
        for _ in range(2):
            fn()
        gpu_ms = _fixed_bench(fn, device, calls)
        wall_ms = _wall_ms(fn, device, calls)
        local_ms = _local_only_ms(Q, shard, k, device)
        workspace = None
        if device.type == "cuda":
            run_peak = max(run_peak, torch.cuda.max_memory_allocated(device))
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            fn()
            torch.cuda.synchronize(device)
            workspace = torch.cuda.max_memory_allocated(device) - before
        case = {
            "queries": nq,
            "first_call_s": first,
            "gpu_ms": gpu_ms,
            "wall_ms": wall_ms,
            "queries_per_s": nq / wall_ms * 1e3,
            "local_only_ms": local_ms,
            "topk_workspace_bytes": workspace,
            "ids_checksum": _checksum(ids),
            "top5_first_query": ids[0, :5].tolist(),
        }
        if mode == "big" or tiny:
            nc = min(CHECK_QUERIES, nq)
            case["float64_check"] = _float64_check(
                shard, lo, Q[:nc], k, scores[:nc], ids[:nc], device
            )
        locals_ms = _gather_floats([local_ms if local_ms is not None else -1.0], device)
        case["local_only_ms_per_rank"] = [v[0] for v in locals_ms]
        record["cases"].append(case)
    if device.type == "cuda":
        run_peak = max(run_peak, torch.cuda.max_memory_allocated(device))
    peak = run_peak
    per_rank = _gather_floats([float(peak), float(shard_bytes)], device)
    record["peak_memory_bytes_per_rank"] = [int(p) for p, _ in per_rank]
    record["shard_bytes_per_rank"] = [int(s) for _, s in per_rank]
    record["peak_minus_shard_bytes_per_rank"] = [int(p - s) if p else None for p, s in per_rank]
    del index, shard
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return record


def _summary(record: dict) -> str:
    lines = [
        f"{record['mode']}: {record['documents']} documents x {record['Ld']} x {record['d']} "
        f"{record['dtype']} on {record['world_size']} rank(s), k {record['k']}"
    ]
    for c in record["cases"]:
        local = max((v for v in c["local_only_ms_per_rank"] if v >= 0), default=float("nan"))
        line = (
            f"  Nq {c['queries']:>3}: gpu {c['gpu_ms']:.3f} ms, wall {c['wall_ms']:.3f} ms, "
            f"{c['queries_per_s']:.1f} queries/s, first call {c['first_call_s']:.2f} s, "
            f"local top-k only {local:.3f} ms"
        )
        if "float64_check" in c:
            chk = c["float64_check"]
            line += (
                f"; float64 ranking {'OK' if chk['ranking_ok'] else 'MISMATCH'} "
                f"(ids equal {chk['ids_equal_fraction']:.3f}, gap {chk['max_relative_score_gap']:.1e})"
            )
        lines.append(line)
    peaks = record["peak_memory_bytes_per_rank"]
    if any(peaks):
        lines.append(
            "  peak memory per GPU (GB): "
            + ", ".join(f"{p / 1e9:.2f}" for p in peaks)
            + "; beyond the shard (GB): "
            + ", ".join(f"{w / 1e9:.3f}" for w in record["peak_minus_shard_bytes_per_rank"])
            + "; one topk call's workspace (MB): "
            + ", ".join(f"{c['topk_workspace_bytes'] / 1e6:.1f}" for c in record["cases"])
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file that rank 0 writes")
    parser.add_argument("--mode", choices=("speed", "big"), default="speed")
    parser.add_argument("--tiny", action="store_true", help="CPU, gloo, tiny shapes")
    parser.add_argument("--calls", type=int, default=None, help="timed calls per case")
    args = parser.parse_args()
    use_cuda = torch.cuda.is_available() and not args.tiny
    dist.init_process_group("nccl" if use_cuda else "gloo")
    if use_cuda:
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
        torch.cuda.set_device(local)
        device, dtype = torch.device("cuda", local), torch.bfloat16
    else:
        device, dtype = torch.device("cpu"), torch.float32
    calls = args.calls or (3 if args.tiny else 10 if args.mode == "big" else 30)
    try:
        record = run(args.mode, args.tiny, device, dtype, calls)
        if dist.get_rank() == 0:
            import triton

            record["environment"] = {
                "device": torch.cuda.get_device_name(device) if use_cuda else "cpu",
                "torch": torch.__version__,
                "triton": triton.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if use_cuda else None,
                "date": time.strftime("%Y-%m-%d"),
                "command": f"sharded_retrieval.py --mode {args.mode}"
                + (" --tiny" if args.tiny else ""),
            }
            with open(args.out, "w") as f:
                json.dump(record, f, indent=2)
            print(_summary(record), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
