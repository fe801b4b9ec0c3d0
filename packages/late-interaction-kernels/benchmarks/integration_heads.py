"""colpali-engine and PyLate loss heads, and the fused projection / residual ops, against what a
user runs without this package.

    python3 packages/late-interaction-kernels/benchmarks/integration_heads.py --out heads.json [--quick]

* ``colpali-neg``: the explicit-negative loss head (``ColbertNegativeCELoss``: positive term,
  ``[B, n_neg, Ld, d]`` negative slab, in-batch term), Lq 32, Ld 1030, d 128, B64x4 ... B256x16,
  forward + backward. With colpali-engine installed the real class is timed unpatched vs patched;
  without it (the GPU image) the same formulas are written out (einsum vs fused ops).
* ``pylate-contrastive``: PyLate's ``Contrastive`` scoring (query-major, one positive and one
  hard negative per query) at bs 64-256, Ld 2048-8192, forward + backward.
* ``from-hidden``: ``maxsim_from_hidden`` vs ``H @ W``, normalise, ``maxsim``.
* ``residual``: ``maxsim_residual`` vs decompress everything, pad, ``maxsim`` (inference).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from late_interaction_kernels import maxsim, maxsim_pairs
from late_interaction_kernels.ops.maxsim_from_hidden import maxsim_from_hidden
from late_interaction_kernels.ops.maxsim_residual import maxsim_residual
from late_interaction_kernels.ops.maxsim_residual.reference import decompress, pack_buckets
from triton_dispatch.bench import benchmark_arguments, compare, report

COLPALI = [(64, 4), (128, 8), (256, 16)]
PYLATE = [(64, 2048), (128, 4096), (256, 8192)]
QUICK_COLPALI = [(8, 2)]
QUICK_PYLATE = [(8, 256)]


def vanilla_negative_head(q, d, n, temperature=0.02, weight=0.5):
    """ColbertNegativeCELoss's arithmetic (hard max, no normalisation), as einsums."""
    pos = torch.einsum("bnd,bsd->bns", q, d).amax(dim=2).sum(dim=1)
    neg = torch.einsum("bnd,blsd->blns", q, n).amax(dim=3).sum(dim=2)
    loss = F.softplus((neg - pos.unsqueeze(1)) / temperature).mean()
    grid = torch.einsum("bnd,csd->bcns", q, d).amax(dim=3).sum(dim=2)
    ib = F.cross_entropy(grid / temperature, torch.arange(q.shape[0], device=q.device))
    return loss * (1 - weight) + ib * weight


def fused_negative_head(q, d, n, temperature=0.02, weight=0.5):
    pos = maxsim_pairs(q, d)
    neg = maxsim(q, n)
    loss = F.softplus((neg - pos.unsqueeze(1)) / temperature).mean()
    grid = maxsim(q, d)
    ib = F.cross_entropy(grid / temperature, torch.arange(q.shape[0], device=q.device))
    return loss * (1 - weight) + ib * weight


def real_colpali_heads():
    """(vanilla, patched) callables on the real ColbertNegativeCELoss, or None without it."""
    try:
        from colpali_engine.loss.late_interaction_losses import ColbertNegativeCELoss
    except ImportError:
        return None
    from late_interaction_kernels.integrations import patch_colpali_engine, unpatch_colpali_engine

    loss = ColbertNegativeCELoss(normalize_scores=False)

    def vanilla(q, d, n):
        unpatch_colpali_engine()
        return loss(q, d, n)

    def patched(q, d, n):
        patch_colpali_engine()
        return loss(q, d, n)

    return vanilla, patched


def train_step(fn, *leaves):
    def run():
        for t in leaves:
            t.grad = None
        fn(*leaves).backward()

    return run


def leaf(gen, shape, device, dtype, *, normalize=True):
    x = torch.randn(shape, generator=gen).to(device, dtype)
    return (F.normalize(x, dim=-1) if normalize else x).requires_grad_()


def main() -> None:
    args = benchmark_arguments(__doc__.splitlines()[0]).parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(0)
    records, started = [], time.perf_counter()
    real = real_colpali_heads()
    for b, k in QUICK_COLPALI if args.quick else COLPALI:
        lq, ld, dim = 32, 1030 if not args.quick else 64, 128
        q = leaf(gen, (b, lq, dim), device, dtype)
        d = leaf(gen, (b, ld, dim), device, dtype)
        n = leaf(gen, (b, k, ld, dim), device, dtype)
        vanilla, ours = real if real else (vanilla_negative_head, fused_negative_head)
        records.append(
            compare(
                f"colpali-neg:B{b}x{k}",
                {"B": b, "n_neg": k, "Lq": lq, "Ld": ld, "d": dim, "dtype": str(dtype)[6:]},
                ours=train_step(ours, q, d, n),
                baseline=train_step(vanilla, q, d, n),
                baseline_name="colpali-engine ColbertNegativeCELoss" if real else "einsum head",
                device=device,
                extra={"published_best_speedup": 4.31 if (b, k) == (256, 16) else None},
            )
        )
        del q, d, n
        print(f"colpali B{b}x{k}: done at {time.perf_counter() - started:.0f}s", flush=True)
    for bs, ld in QUICK_PYLATE if args.quick else PYLATE:
        lq, dim, groups = 32, 128, 2
        q = leaf(gen, (bs, lq, dim), device, dtype)
        docs = leaf(gen, (bs, groups, ld, dim), device, dtype)
        flat = lambda x: x.reshape(-1, ld, dim)

        def vanilla(q, docs):
            sim = torch.einsum("ash,bth->abst", q, flat(docs))
            return F.cross_entropy(sim.amax(-1).sum(-1), torch.arange(bs, device=q.device) * groups)

        def fused(q, docs):
            return F.cross_entropy(
                maxsim(q, flat(docs)), torch.arange(bs, device=q.device) * groups
            )

        records.append(
            compare(
                f"pylate-contrastive:bs{bs}:Ld{ld}",
                {"bs": bs, "docs_per_query": groups, "Lq": lq, "Ld": ld, "d": dim},
                ours=train_step(fused, q, docs),
                baseline=train_step(vanilla, q, docs),
                baseline_name="PyLate colbert_scores (einsum)",
                device=device,
            )
        )
        del q, docs
        print(f"pylate bs{bs} Ld{ld}: done at {time.perf_counter() - started:.0f}s", flush=True)
    nd, ld, h, dim = (8, 64, 64, 32) if args.quick else (512, 512, 768, 128)
    q = leaf(gen, (32, 32, dim), device, dtype)
    hidden = leaf(gen, (nd, ld, h), device, dtype, normalize=False)
    w = leaf(gen, (h, dim), device, dtype, normalize=False)
    records.append(
        compare(
            f"from-hidden:Nd{nd}:Ld{ld}:h{h}",
            {"Nq": 32, "Nd": nd, "Ld": ld, "h": h, "d": dim},
            ours=train_step(lambda q, hh, ww: maxsim_from_hidden(q, hh, ww).sum(), q, hidden, w),
            baseline=train_step(
                lambda q, hh, ww: maxsim(q, F.normalize(hh @ ww, dim=-1)).sum(), q, hidden, w
            ),
            baseline_name="project + normalize + maxsim",
            device=device,
        )
    )
    n_docs, per_doc, nbits = (16, 32, 2) if args.quick else (20000, 128, 2)
    tokens = n_docs * per_doc
    centroids = F.normalize(torch.randn(4096, dim, generator=gen), dim=-1).to(device, dtype)
    codes = torch.randint(0, 4096, (tokens,), generator=gen).to(device)
    packed = pack_buckets(torch.randint(0, 1 << nbits, (tokens, dim), generator=gen), nbits).to(
        device
    )
    weights = torch.linspace(-0.05, 0.05, 1 << nbits).to(device, dtype)
    doclens = torch.full((n_docs,), per_doc, device=device)
    qi = q.detach()

    def decompress_then_score():
        emb = decompress(centroids, codes, packed, weights, nbits).to(dtype)
        return maxsim(qi, emb.reshape(n_docs, per_doc, dim))

    with torch.no_grad():
        records.append(
            compare(
                f"residual:Nd{n_docs}:Ld{per_doc}:nbits{nbits}",
                {"Nq": 32, "Nd": n_docs, "Ld": per_doc, "d": dim, "nbits": nbits},
                ours=lambda: maxsim_residual(
                    qi, centroids, codes, packed, weights, doclens, nbits=nbits
                ),
                baseline=decompress_then_score,
                baseline_name="decompress all + maxsim",
                device=device,
            )
        )
    report(records, args.out, meta={"script": "integration_heads.py", "quick": args.quick})


if __name__ == "__main__":
    main()
