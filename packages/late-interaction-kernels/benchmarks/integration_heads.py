"""colpali-engine and PyLate loss heads, and the fused projection / residual ops, against what a
user runs without this package.

    python3 packages/late-interaction-kernels/benchmarks/integration_heads.py --out heads.json [--quick]

* ``colpali-neg``: the explicit-negative loss head (``ColbertNegativeCELoss``: positive term,
  ``[B, n_neg, Ld, d]`` negative slab, in-batch term), Lq 32, Ld 1030, d 128, B64x4 ... B256x16,
  forward + backward. With colpali-engine installed the real class is timed unpatched vs patched;
  without it (the GPU image) the same formulas are written out (einsum vs fused ops).
* ``pylate-contrastive``: PyLate's ``Contrastive`` scoring (query-major, one positive and one
  hard negative per query) at bs 64-256, Ld 2048-8192, forward + backward.
* ``from-hidden``: ``maxsim_from_hidden`` vs ``H @ W``, normalise, ``maxsim``; in-batch training
  (Nq = Nd = 64, 128; forward, and forward + backward) and a rerank of 1000 documents (forward),
  Lq 32, Ld 300 (half to all tokens valid), h 768, d 128.
* ``residual``: ``maxsim_residual`` vs decompress everything, pad, ``maxsim`` (inference), Nq 1-32,
  Nd 1000-10000 documents of 100-300 tokens, nbits 2 and 4, d 128.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from late_interaction_kernels import maxsim, maxsim_pairs
from late_interaction_kernels.ops.maxsim_from_hidden import maxsim_from_hidden
from late_interaction_kernels.ops.maxsim_residual import maxsim_residual
from late_interaction_kernels.ops.maxsim_residual.reference import pack_buckets, unpack_buckets
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


def warmed(fn):
    """``fn`` after one call: the first call of a shape regime autotunes the kernels it runs
    (timed on CUDA graphs), which must not overlap the measurement."""
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return fn


def leaf(gen, shape, device, dtype, *, normalize=True):
    x = torch.randn(shape, generator=gen).to(device, dtype)
    return (F.normalize(x, dim=-1) if normalize else x).requires_grad_()


#: (Nq, Nd, Ld, train): in-batch training steps (forward, and forward + backward) and a rerank of
#: 1000 documents (forward); h 768 and d 128 (a BERT-base ColBERT head).
FROM_HIDDEN = [(64, 64, 300, True), (128, 128, 300, True), (1, 1000, 300, False)]
QUICK_FROM_HIDDEN = [(4, 4, 40, True)]
#: (Nq, Nd, nbits): PLAID reranking, documents of 100-300 tokens, d 128.
RESIDUAL = [(1, 10000, 2), (32, 1000, 2), (32, 10000, 2), (8, 10000, 4)]
QUICK_RESIDUAL = [(2, 16, 2)]


def from_hidden_cases(quick, device, dtype, gen, started) -> list:
    """``maxsim_from_hidden`` vs ``H @ W``, normalise, ``maxsim`` (what a ColBERT head + the
    fused scorer would otherwise run): forward alone, and forward + backward when training."""
    records = []
    h, dim, lq = (64, 32, 8) if quick else (768, 128, 32)
    for nq, nd, ld, train in QUICK_FROM_HIDDEN if quick else FROM_HIDDEN:
        q = leaf(gen, (nq, lq, dim), device, dtype)
        hidden = leaf(gen, (nd, ld, h), device, dtype, normalize=False)
        w = (torch.randn(h, dim, generator=gen) / h**0.5).to(device, dtype).requires_grad_()
        lengths = torch.randint(ld // 2, ld + 1, (nd,), generator=gen)
        d_mask = (torch.arange(ld)[None, :] < lengths[:, None]).to(device)

        def fused(q, hh, ww):
            return maxsim_from_hidden(q, hh, ww, None, d_mask, fused=True)

        def baseline(q, hh, ww):
            return maxsim(q, F.normalize(hh @ ww, dim=-1), None, d_mask)

        shape = {"Nq": nq, "Nd": nd, "Lq": lq, "Ld": ld, "h": h, "d": dim, "dtype": str(dtype)[6:]}
        name = f"from-hidden:Nq{nq}:Nd{nd}:Ld{ld}"
        with torch.no_grad():
            records.append(
                compare(
                    name + ":forward",
                    shape,
                    ours=lambda: fused(q, hidden, w),
                    baseline=lambda: baseline(q, hidden, w),
                    baseline_name="H @ W, normalize, maxsim",
                    device=device,
                )
            )
        if train:
            records.append(
                compare(
                    name + ":train",
                    shape,
                    ours=train_step(lambda *x: fused(*x).sum(), q, hidden, w),
                    baseline=train_step(lambda *x: baseline(*x).sum(), q, hidden, w),
                    baseline_name="H @ W, normalize, maxsim (forward + backward)",
                    device=device,
                )
            )
        print(
            f"from-hidden Nq{nq} Nd{nd}: done at {time.perf_counter() - started:.0f}s", flush=True
        )
    return records


def residual_cases(quick, device, dtype, gen, started) -> list:
    """``maxsim_residual`` vs decompressing every document, padding, ``maxsim`` (inference)."""
    records = []
    dim, lq, n_centroids = (32, 8, 64) if quick else (128, 32, 4096)
    lo, hi = (8, 32) if quick else (100, 300)
    centroids = F.normalize(torch.randn(n_centroids, dim, generator=gen), dim=-1)
    centroids = centroids.to(device, dtype)
    for nq, n_docs, nbits in QUICK_RESIDUAL if quick else RESIDUAL:
        doclens = torch.randint(lo, hi + 1, (n_docs,), generator=gen)
        tokens = int(doclens.sum())
        codes = torch.randint(0, n_centroids, (tokens,), generator=gen).to(device)
        buckets = torch.randint(0, 1 << nbits, (tokens, dim), generator=gen)
        packed = pack_buckets(buckets, nbits).to(device)
        weights = torch.linspace(-0.05, 0.05, 1 << nbits).to(device, dtype)
        q = F.normalize(torch.randn(nq, lq, dim, generator=gen), dim=-1).to(device, dtype)
        # where each stored token goes in the padded (Nd, max_len, d) block: computed once, as a
        # user scoring the same collection repeatedly would
        width = int(doclens.max())
        doc_of_token = torch.repeat_interleave(torch.arange(n_docs), doclens).to(device)
        starts = torch.cumsum(doclens, 0) - doclens
        slot = (torch.arange(tokens) - starts.repeat_interleave(doclens)).to(device)
        d_mask = (torch.arange(width)[None, :] < doclens[:, None]).to(device)
        doclens = doclens.to(device)

        # ColBERT's ResidualCodec decompresses through a byte -> bucket indices lookup table
        table = unpack_buckets(torch.arange(256, dtype=torch.uint8)[:, None], nbits, 8 // nbits)
        table = table.to(device)

        def decompress_then_score():
            residual = weights[table[packed.long()]].reshape(tokens, dim)
            emb = F.normalize(centroids[codes] + residual, dim=-1).to(dtype)
            padded = emb.new_zeros(n_docs, width, dim)
            padded[doc_of_token, slot] = emb
            return maxsim(q, padded, None, d_mask)

        def fused():
            return maxsim_residual(q, centroids, codes, packed, weights, doclens, nbits=nbits)

        with torch.no_grad():
            records.append(
                compare(
                    f"residual:Nq{nq}:Nd{n_docs}:nbits{nbits}",
                    {"Nq": nq, "Nd": n_docs, "Ld": f"{lo}-{hi}", "tokens": tokens, "d": dim,
                     "nbits": nbits, "dtype": str(dtype)[6:]},
                    ours=fused,
                    baseline=decompress_then_score,
                    baseline_name="decompress all (lookup table), pad, maxsim",
                    device=device,
                )
            )  # fmt: skip
        print(
            f"residual Nq{nq} Nd{n_docs}: done at {time.perf_counter() - started:.0f}s", flush=True
        )
    return records


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
        step = warmed(train_step(ours, q, d, n))
        records.append(
            compare(
                f"colpali-neg:B{b}x{k}",
                {"B": b, "n_neg": k, "Lq": lq, "Ld": ld, "d": dim, "dtype": str(dtype)[6:]},
                ours=step,
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
                ours=warmed(train_step(fused, q, docs)),
                baseline=train_step(vanilla, q, docs),
                baseline_name="PyLate colbert_scores (einsum)",
                device=device,
            )
        )
        del q, docs
        print(f"pylate bs{bs} Ld{ld}: done at {time.perf_counter() - started:.0f}s", flush=True)
    records += from_hidden_cases(args.quick, device, dtype, gen, started)
    records += residual_cases(args.quick, device, dtype, gen, started)
    report(records, args.out, meta={"script": "integration_heads.py", "quick": args.quick})


if __name__ == "__main__":
    main()
