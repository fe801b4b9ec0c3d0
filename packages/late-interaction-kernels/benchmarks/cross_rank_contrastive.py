"""Contrastive scoring step across ranks: ``maxsim_across_ranks`` against gathering the documents
with ``torch.distributed.nn.all_gather`` (PyLate's and sentence-transformers' route) and scoring
them, and against one GPU scoring its local batch alone.

    python3 -m torch.distributed.run --nproc_per_node=2 \\
        packages/late-interaction-kernels/benchmarks/cross_rank_contrastive.py --out FILE.json

    # on a CPU, interpreted kernels and gloo, tiny shapes (checks that the script runs)
    TRITON_INTERPRET=1 python -m torch.distributed.run --nproc_per_node=2 \\
        packages/late-interaction-kernels/benchmarks/cross_rank_contrastive.py --tiny --out y.json

A step is the PyLate shape (per rank 128 queries of 32 tokens, 128 documents of 300 tokens, d 128,
bf16, unit-norm tokens): scores of the local queries against every rank's documents, in-batch
cross-entropy with the positive of query ``i`` at its own document, forward and backward to the
queries and documents. Timed per rank:

* ``across_ranks``: :func:`maxsim_across_ranks`;
* ``all_gather_with_grad``: ``torch.cat(torch.distributed.nn.all_gather(D))`` then ``maxsim``;

and on rank 0 alone (the others wait):

* ``single_local``: one GPU, its local batch (128 queries x 128 documents), the step a rank runs
  without cross-rank negatives;
* ``single_same_compute``: one GPU, 128 queries x (world x 128) documents, the scoring work of a
  cross-rank step without its communication.

The distributed steps run a fixed number of calls on every rank (a collective needs every rank;
``do_bench`` picks its count per process), each between CUDA events: the median of those is the
GPU time; the wall time per call is a back-to-back loop timed on the host. The single-GPU steps
also get ``triton.testing.do_bench`` medians. Then rank 0 gathers every rank's loss and gradients
and compares them with one process scoring the concatenated batch (the same kernels, and the
float64 reference).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.nn as dist_nn
import torch.nn.functional as F

from late_interaction_kernels import maxsim, maxsim_across_ranks
from late_interaction_kernels.ops.maxsim.reference import maxsim_reference
from triton_dispatch.bench import (
    collective_ms,
    environment,
    format_profile,
    median_ms,
    peak_memory_bytes,
    profile_step,
)
from triton_dispatch.graphs import CapturedStep

FULL = dict(nq=128, lq=32, nd=128, ld=300, dim=128, warmup=10, iters=50)
TINY = dict(nq=3, lq=4, nd=3, ld=6, dim=16, warmup=1, iters=3)


def _batch(rank: int, shape: dict, device, dtype, seed: int = 0):
    """Rank ``rank``'s queries and documents (any rank can draw any other's)."""
    g = torch.Generator().manual_seed(seed + rank)
    Q = F.normalize(torch.randn(shape["nq"], shape["lq"], shape["dim"], generator=g), dim=-1)
    D = F.normalize(torch.randn(shape["nd"], shape["ld"], shape["dim"], generator=g), dim=-1)
    return (
        Q.to(device, dtype).requires_grad_(),
        D.to(device, dtype).requires_grad_(),
    )


def _loss(scores: torch.Tensor, offset: int) -> torch.Tensor:
    targets = torch.arange(scores.shape[0], device=scores.device) + offset
    return F.cross_entropy(scores, targets)


def step_across_ranks(Q, D):
    scores, offset = maxsim_across_ranks(Q, D, normalize=False, return_offset=True)
    loss = _loss(scores, offset)
    return (loss, *torch.autograd.grad(loss, (Q, D)))


def step_across_ranks_uniform(Q, D):
    scores, offset = maxsim_across_ranks(Q, D, normalize=False, return_offset=True, uniform=True)
    loss = _loss(scores, offset)
    return (loss, *torch.autograd.grad(loss, (Q, D)))


def step_all_gather_with_grad(Q, D):
    docs = torch.cat(dist_nn.all_gather(D))
    loss = _loss(maxsim(Q, docs, normalize=False), dist.get_rank() * D.shape[0])
    return (loss, *torch.autograd.grad(loss, (Q, D)))


def step_single(Q, D):
    loss = _loss(maxsim(Q, D, normalize=False), 0)
    return (loss, *torch.autograd.grad(loss, (Q, D)))


def time_collective(
    fn, device, warmup: int, iters: int, profile: bool = False, together: bool = True
) -> dict:
    """The same number of calls on every rank (``collective_ms``): per-call GPU time (events),
    GPU time per call of a back-to-back loop, wall time; where the time goes with ``profile``."""
    timed = collective_ms(fn, device=device, calls=iters, warmup=warmup, together=together)
    out = {
        "median_ms": timed["gpu_ms"],
        "loop_ms_per_call": timed["loop_gpu_ms"],
        "wall_ms_per_call": timed["wall_ms"],
        "peak_bytes": peak_memory_bytes(fn, device=device),
    }
    if profile:
        out["profile"] = profile_step(fn, device=device, calls=20, python_top=12, together=together)
    return out


def time_single(fn, device, warmup: int, iters: int, profile: bool = False) -> dict:
    """One process alone: the same timer as the collectives, plus ``do_bench``."""
    out = time_collective(fn, device, warmup, iters, profile, together=False)
    if device.type == "cuda":
        out["do_bench_median_ms"] = median_ms(fn, device=device)
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def check_equality(rank: int, world: int, shape: dict, device, dtype) -> dict | None:
    """Every rank's loss and gradients, gathered on rank 0 and compared with one process on the
    concatenated batch, in the kernels' dtype and in the float64 reference."""
    Q, D = _batch(rank, shape, device, dtype)
    loss, gq, gd = step_across_ranks(Q, D)
    _, nq_gq, nq_gd = step_all_gather_with_grad(Q, D)
    mine = [t.detach().cpu() for t in (Q, D, loss, gq, gd, nq_gq, nq_gd)]
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if rank != 0:
        return None
    Qs = [g[0].to(device).requires_grad_() for g in gathered]
    D_all = torch.cat([g[1] for g in gathered]).to(device).requires_grad_()
    nd = shape["nd"]
    out: dict = {}
    for name, to in (("kernels_one_process", None), ("reference_float64", torch.float64)):
        qs = [q if to is None else q.detach().to(to).requires_grad_() for q in Qs]
        docs = D_all if to is None else D_all.detach().to(to).requires_grad_()
        score = maxsim if to is None else maxsim_reference
        total = sum(_loss(score(q, docs), r * nd) for r, q in enumerate(qs))
        grads = torch.autograd.grad(total, [*qs, docs])
        worst = {"loss": 0.0, "grad_Q": 0.0, "grad_D": 0.0}
        worst_naive = {"grad_Q": 0.0, "grad_D": 0.0}
        summed_loss = sum(float(g[2]) for g in gathered)
        worst["loss"] = abs(summed_loss - float(total.detach())) / abs(float(total.detach()))
        for r, g in enumerate(gathered):
            ref_gd = grads[-1][r * nd : (r + 1) * nd]
            worst["grad_Q"] = max(worst["grad_Q"], _rel(g[3], grads[r]))
            worst["grad_D"] = max(worst["grad_D"], _rel(g[4], ref_gd))
            worst_naive["grad_Q"] = max(worst_naive["grad_Q"], _rel(g[5], grads[r]))
            worst_naive["grad_D"] = max(worst_naive["grad_D"], _rel(g[6], ref_gd))
        out[f"across_ranks_vs_{name}"] = worst
        out[f"all_gather_with_grad_vs_{name}"] = worst_naive
    # the two routes against each other
    out["across_ranks_vs_all_gather_with_grad"] = {
        "grad_Q": max(_rel(g[3], g[5]) for g in gathered),
        "grad_D": max(_rel(g[4], g[6]) for g in gathered),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="cross_rank_contrastive.json")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU, interpreter)")
    parser.add_argument("--profile", action="store_true", help="where each step's time goes")
    args = parser.parse_args()
    started = time.perf_counter()
    cuda = torch.cuda.is_available() and not args.tiny
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shape = TINY if args.tiny else FULL
    # Triton's interpreter computes bf16 dots wrongly; fp32 there
    dtype = torch.bfloat16 if cuda else torch.float32
    warmup, iters = shape["warmup"], shape["iters"]

    Q, D = _batch(rank, shape, device, dtype)
    results: dict = {"per_rank": {}}
    for name, step in (
        ("across_ranks", step_across_ranks),
        ("across_ranks_uniform", step_across_ranks_uniform),
        ("all_gather_with_grad", step_all_gather_with_grad),
    ):
        record = time_collective(lambda s=step: s(Q, D), device, warmup, iters, args.profile)
        per_rank = [None] * world
        dist.all_gather_object(per_rank, record)
        results["per_rank"][name] = per_rank
    if cuda:
        # the uniform step replayed as one CUDA graph, collectives included (the default path's
        # size exchange reads the sizes back on the host, which a graph cannot hold)
        graphed = CapturedStep(lambda: step_across_ranks_uniform(Q, D)[0])
        record = time_collective(graphed, device, warmup, iters, args.profile)
        per_rank = [None] * world
        dist.all_gather_object(per_rank, record)
        results["per_rank"]["across_ranks_uniform_graphed"] = per_rank
        # a live graph holding NCCL kernels keeps the communicator from being torn down
        del graphed
        torch.cuda.synchronize(device)

    if rank == 0:
        docs = torch.cat([D] + [_batch(r, shape, device, dtype)[1] for r in range(1, world)])
        docs = docs.detach().requires_grad_()
        results["single_local"] = time_single(
            lambda: step_single(Q, D), device, warmup, iters, args.profile
        )
        results["single_same_compute"] = time_single(
            lambda: step_single(Q, docs), device, warmup, iters, args.profile
        )
        if cuda:
            graphed_single = CapturedStep(lambda: step_single(Q, D)[0])
            results["single_local_graphed"] = time_single(
                graphed_single, device, warmup, iters, args.profile
            )
            del graphed_single
    dist.barrier()
    equality = check_equality(rank, world, shape, device, dtype)

    if rank == 0:
        step_ms = {
            name: max(r["median_ms"] for r in per_rank)
            for name, per_rank in results["per_rank"].items()
        }
        wall_ms = {
            name: max(r["wall_ms_per_call"] for r in per_rank)
            for name, per_rank in results["per_rank"].items()
        }
        loop_ms = {
            name: max(r["loop_ms_per_call"] for r in per_rank)
            for name, per_rank in results["per_rank"].items()
        }
        local, same = results["single_local"], results["single_same_compute"]
        summary = {
            "across_ranks_ms": step_ms["across_ranks"],
            "across_ranks_uniform_ms": step_ms["across_ranks_uniform"],
            "all_gather_with_grad_ms": step_ms["all_gather_with_grad"],
            "single_local_ms": local["median_ms"],
            "single_same_compute_ms": same["median_ms"],
            "ratio_vs_single_local": step_ms["across_ranks"] / local["median_ms"],
            "loop_ratio_uniform_vs_single_local": loop_ms["across_ranks_uniform"]
            / local["loop_ms_per_call"],
            "ratio_vs_single_same_compute": step_ms["across_ranks"] / same["median_ms"],
            "graphed_ratio_vs_single_local_graphed": (
                loop_ms["across_ranks_uniform_graphed"]
                / results["single_local_graphed"]["loop_ms_per_call"]
                if "single_local_graphed" in results
                else None
            ),
            "speedup_vs_all_gather_with_grad": step_ms["all_gather_with_grad"]
            / step_ms["across_ranks"],
            "loop_ms_per_call": {
                **loop_ms,
                "single_local": local["loop_ms_per_call"],
                "single_same_compute": same["loop_ms_per_call"],
            },
            "wall_ms_per_call": {
                **wall_ms,
                "single_local": local["wall_ms_per_call"],
                "single_same_compute": same["wall_ms_per_call"],
            },
        }
        record = {
            "benchmark": "cross_rank_contrastive",
            "world_size": world,
            "backend": dist.get_backend(),
            "shape": {k: shape[k] for k in ("nq", "lq", "nd", "ld", "dim")},
            "dtype": str(dtype),
            "environment": environment(device),
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
            "summary": summary,
            "results": results,
            "equality": equality,
            "seconds": time.perf_counter() - started,
        }
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2)
        print(f"{world} ranks, {record['environment']['device']}, {dtype}, per rank {shape}")
        print(f"{'step':<34}{'median ms':>10}{'loop ms':>10}{'wall ms':>10}")
        for name in results["per_rank"]:
            print(
                f"{name + ' (slowest rank)':<34}{step_ms[name]:>10.3f}{loop_ms[name]:>10.3f}"
                f"{wall_ms[name]:>10.3f}"
            )
            for i, r in enumerate(results["per_rank"][name]):
                if "profile" in r:
                    print(
                        "    " + format_profile(f"rank {i}", r["profile"]).replace("\n", "\n    ")
                    )
        for name in ("single_local", "single_same_compute", "single_local_graphed"):
            if name not in results:
                continue
            r = results[name]
            print(
                f"{name + ' (rank 0)':<34}{r['median_ms']:>10.3f}{r['loop_ms_per_call']:>10.3f}"
                f"{r['wall_ms_per_call']:>10.3f}"
            )
            if "profile" in r:
                print("    " + format_profile("rank 0", r["profile"]).replace("\n", "\n    "))
        print(
            f"across_ranks / single_local {summary['ratio_vs_single_local']:.3f}, "
            f"/ single_same_compute {summary['ratio_vs_single_same_compute']:.3f}, "
            f"all_gather_with_grad / across_ranks {summary['speedup_vs_all_gather_with_grad']:.3f}"
        )
        for key, errors in equality.items():
            print(f"{key:<50}" + "  ".join(f"{k} {v:.2e}" for k, v in errors.items()))
        print(f"wrote {args.out} in {record['seconds']:.1f} s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
