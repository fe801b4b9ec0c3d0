"""Where the read-bound MaxSim forward loses to flash-maxsim: one query of 32 tokens against
10,000 documents of 300 (768 MB read), every variant timed in one process, interleaved rounds.

* ``public``: ``maxsim(Q, D)`` as users call it; ``public, graph``: the same call replayed from a
  CUDA graph (no host work at all);
* ``program``: the package's forward program launched directly with the table's config;
* ``flash-maxsim``: ``flash_maxsim_batched`` when ``--flash DIR`` holds flash-maxsim 0.3.0;
* ``stream``: a minimal one-loop kernel (one program per document) over document tile, warps,
  stages, the load's layout (K-major as ours, or row-major transposed into the dot as
  flash-maxsim's), and once with a cache modifier and an eviction policy: what the package's
  kernel would gain from each.

Each is timed by ``do_bench`` (L2 flushed before each call, as ``peers.py``) and back to back (no
flush: the wall time per call a serving loop sees).

    python3 tools/gpu/read_bound_gap.py --flash gpu-results/peers/flash-maxsim --out gap.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
import triton.testing

ROOT = Path(__file__).resolve().parents[2]
for src in ("shared/triton-dispatch/src", "packages/late-interaction-kernels/src"):
    sys.path.insert(0, str(ROOT / src))

sys.path.insert(0, str(Path(__file__).parent))

from maxsim_read_bound import _probe_kernel  # noqa: E402

from late_interaction_kernels import maxsim  # noqa: E402
from triton_dispatch.bench import wall_ms_per_call  # noqa: E402

NQ, ND, LQ, LD, DIM = 1, 10000, 32, 300, 128


@triton.jit(do_not_specialize=["ld"])
def _stream_kernel(
    Q, D, OUT, ld,
    LQ: tl.constexpr, DIM: tl.constexpr, BLOCK_D: tl.constexpr, ROW_MAJOR: tl.constexpr,
    CACHE: tl.constexpr, EVICT: tl.constexpr,
):  # fmt: skip
    doc = tl.program_id(0)
    rows = tl.arange(0, LQ)
    k = tl.arange(0, DIM)
    q = tl.load(Q + rows[:, None] * DIM + k[None, :])
    base = D + doc.to(tl.int64) * ld * DIM
    best = tl.full((LQ,), float("-inf"), tl.float32)
    for j0 in range(0, ld, BLOCK_D):
        cols = j0 + tl.arange(0, BLOCK_D)
        ok = cols < ld
        if ROW_MAJOR:
            x = tl.load(base + cols[:, None] * DIM + k[None, :], mask=ok[:, None], other=0.0,
                        cache_modifier=CACHE, eviction_policy=EVICT)  # fmt: skip
            s = tl.dot(q, tl.trans(x))
        else:
            x = tl.load(base + cols[None, :] * DIM + k[:, None], mask=ok[None, :], other=0.0,
                        cache_modifier=CACHE, eviction_policy=EVICT)  # fmt: skip
            s = tl.dot(q, x)
        s = tl.where(ok[None, :], s, float("-inf"))
        best = tl.maximum(best, tl.max(s, 1))
    tl.store(OUT + doc, tl.sum(best, 0))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flash", type=Path, default=None, help="folder holding flash_maxsim")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--out", default=os.path.join(os.environ.get("OUT", "."), "read_bound_gap.json")
    )
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(NQ, LQ, DIM, device="cuda", generator=g), dim=-1)
    d = torch.nn.functional.normalize(torch.randn(ND, LD, DIM, device="cuda", generator=g), dim=-1)
    q, d = q.to(torch.bfloat16), d.to(torch.bfloat16)
    moved = d.numel() * d.element_size()
    copy = torch.empty_like(d)
    copy_ms = triton.testing.do_bench(lambda: copy.copy_(d), rep=200)
    copy_gbps = 2 * moved / copy_ms / 1e6
    ref = maxsim(q, d).float()

    variants: dict[str, object] = {"public": lambda: maxsim(q, d)}
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        maxsim(q, d)
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        maxsim(q, d)
    variants["public, graph"] = graph.replay
    partial = torch.empty(ND, device="cuda")
    variants["program (64, 4 warps, 3 stages, one loop)"] = lambda: _probe_kernel[(ND,)](
        q, d, partial, ND, LQ, LD, DIM, BLOCK_K=DIM, BLOCK_Q=32, BLOCK_D=64, TILE_MAX=False,
        ONE_LOOP=True, num_warps=4, num_stages=3,
    )  # fmt: skip
    if args.flash is not None:
        sys.path.insert(0, str(args.flash))
        from flash_maxsim import flash_maxsim_batched

        flash_q, flash_d = q.contiguous(), d.contiguous()
        variants["flash-maxsim"] = lambda: flash_maxsim_batched(flash_q, flash_d)
    out = torch.empty(ND, device="cuda")
    # the pipeliner turns the tile loads into cp.async copies, which drop the eviction hint: one
    # variant with the hints shows whether that holds on the card
    stream_space = [(*c, "", "") for c in itertools.product((32, 64, 128), (4, 8), (2, 3, 4, 5),
                                                             (False, True))]  # fmt: skip
    stream_space.append((64, 4, 3, False, ".cg", "evict_first"))
    for bd, warps, stages, row_major, cache, evict in stream_space:
        if (bd == 128 and stages == 5) or (bd == 32 and warps == 8):
            continue
        name = (f"stream {bd}, {warps} warps, {stages} stages, {'rows' if row_major else 'K-major'}"
                f"{', ' + cache if cache else ''}{', ' + evict if evict else ''}")  # fmt: skip
        variants[name] = (lambda bd=bd, warps=warps, stages=stages, row_major=row_major,
                          cache=cache, evict=evict: _stream_kernel[(ND,)](
            q, d, out, LD, LQ=LQ, DIM=DIM, BLOCK_D=bd, ROW_MAJOR=row_major, CACHE=cache,
            EVICT=evict, num_warps=warps, num_stages=stages))  # fmt: skip

    results: dict[str, dict] = {}
    for name, fn in list(variants.items()):
        try:
            fn()
            torch.cuda.synchronize()
            got = (
                out
                if name.startswith("stream")
                else partial
                if name.startswith("program")
                else None
            )
            if got is not None:
                err = (got.view(NQ, ND) - ref).abs().max().item()
                if err > 1e-2:
                    raise RuntimeError(f"max |diff| {err:.2e} against maxsim")
        except Exception as exc:  # a variant that fails to compile or differs is reported, not run
            results[name] = {"error": str(exc)[:300]}
            del variants[name]
    for _ in range(args.rounds):
        for name, fn in variants.items():
            r = results.setdefault(name, {"ms": [], "wall_ms": []})
            r["ms"].append(triton.testing.do_bench(fn, rep=100))
            r["wall_ms"].append(wall_ms_per_call(fn, device="cuda", calls=200))
    rows = []
    for name, r in results.items():
        if "error" in r:
            rows.append({"variant": name, **r})
            continue
        ms, wall = min(r["ms"]), min(r["wall_ms"])
        rows.append({"variant": name, "ms": ms, "wall_ms": wall, "all_ms": r["ms"],
                     "of_copy": moved / ms / 1e6 / copy_gbps,
                     "wall_of_copy": moved / wall / 1e6 / copy_gbps})  # fmt: skip
    ranked = sorted((r for r in rows if "ms" in r), key=lambda r: r["wall_ms"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                          "copy_gbps": copy_gbps, "rows": rows}, indent=1))  # fmt: skip
    print(f"{torch.cuda.get_device_name()}: copy {copy_gbps:.0f} GB/s; {moved / 1e6:.0f} MB read")
    print("| variant | do_bench ms | back-to-back ms | of copy rate (back to back) |")
    print("| --- | --- | --- | --- |")
    keep = {"public", "public, graph", "flash-maxsim"}
    shown = [r for r in ranked if r["variant"] in keep or r["variant"].startswith("program")]
    shown += [r for r in ranked if r["variant"].startswith("stream")][:14]
    for r in sorted(shown, key=lambda r: r["wall_ms"]):
        print(
            f"| {r['variant']} | {r['ms']:.4f} | {r['wall_ms']:.4f} | {100 * r['wall_of_copy']:.0f} % |"
        )
    for r in rows:
        if "error" in r:
            print(f"ERROR {r['variant']}: {r['error'][:160]}")


if __name__ == "__main__":
    main()
