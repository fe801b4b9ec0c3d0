"""Triton kernel of ``maxsim_topk``: fused MaxSim scoring and a running top-k per program.

Program ``(g, p)`` holds ``QUERIES`` queries in registers (their tokens stacked into one tile of
``QUERIES * BLOCK_Q`` rows, so each document tile is read once for all of them and feeds a larger
``tl.dot``), scores its run of documents and keeps, per query, the ``K_PAD`` best keys seen so far
in registers: a new document replaces the query's current worst key when it beats it. Only the
programs' candidates are written, ``(Nq, programs, K_PAD)``.

The loop runs over (document, tile) pairs as one flat sequence, so the compiler's software
pipeline prefetches the next document's first tile while the current one finishes: streaming the
collection at memory speed is the whole cost at corpus scale.
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_dispatch import autotune, config_space

from ..tiles import dot_rows, load_rows

_CONFIGS = config_space({"BLOCK_D": [64, 128]}, num_warps=[4, 8], num_stages=[3, 4])
_INTERPRET_CONFIG = triton.Config({"BLOCK_D": 16}, num_warps=4, num_stages=1)


@autotune(
    _CONFIGS,
    key=["QUERIES", "BLOCK_Q", "BLOCK_K", "NORMALIZE", "HAS_DM"],
    interpret_config=_INTERPRET_CONFIG,
)
@triton.jit
def topk_kernel(
    Q, D, QM, DM, OUT_KEY, OUT_IDX,
    nq, lq, ld, dim, nd, docs_per_prog,
    HAS_QM: tl.constexpr, HAS_DM: tl.constexpr, NORMALIZE: tl.constexpr,
    LARGEST: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, NORM_EPS: tl.constexpr,
    QUERIES: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
    K_PAD: tl.constexpr,
):  # fmt: skip
    g = tl.program_id(0)
    p = tl.program_id(1)
    n_prog = tl.num_programs(1)
    r = tl.arange(0, QUERIES * BLOCK_Q)
    query = g * QUERIES + r // BLOCK_Q
    token = r % BLOCK_Q
    row_ok = (token < lq) & (query < nq)
    ks = tl.arange(0, BLOCK_K)
    cols = tl.arange(0, BLOCK_D)
    k_ok = ks < dim
    q_rows = query.to(tl.int64) * lq + token
    q = load_rows(Q, q_rows, row_ok, ks, k_ok, dim, UPCAST)
    q_live = row_ok
    if HAS_QM:
        q_live = q_live & (tl.load(QM + q_rows, mask=row_ok, other=0) != 0)
    if NORMALIZE:
        qf = q.to(tl.float32)
        q_inv = 1.0 / tl.maximum(tl.sqrt(tl.sum(qf * qf, 1)), NORM_EPS)

    lanes = tl.arange(0, K_PAD)
    best = tl.full([QUERIES, K_PAD], float("-inf"), tl.float32)
    best_idx = tl.full([QUERIES, K_PAD], -1, tl.int64)
    m = tl.full([QUERIES * BLOCK_Q], float("-inf"), tl.float32)
    # int64 document offsets: Nd * Ld * d passes 2**31 on large collections
    start = p.to(tl.int64) * docs_per_prog
    count = tl.minimum(start + docs_per_prog, nd) - start
    n_tiles = tl.cdiv(ld, BLOCK_D)
    for step in range(0, count * n_tiles):
        jj = step // n_tiles
        t0 = (step - jj * n_tiles) * BLOCK_D
        j = start + jj
        t = t0 + cols
        t_ok = t < ld
        x = load_rows(D, j * ld + t, t_ok, ks, k_ok, dim, UPCAST)
        s = dot_rows(q, x, IEEE)
        if NORMALIZE:
            xf = x.to(tl.float32)
            x_inv = 1.0 / tl.maximum(tl.sqrt(tl.sum(xf * xf, 1)), NORM_EPS)
            s = s * q_inv[:, None] * x_inv[None, :]
        if HAS_DM:
            t_ok = t_ok & (tl.load(DM + j * ld + t, mask=t_ok, other=0) != 0)
        s = tl.where(t_ok[None, :], s, float("-inf"))
        m = tl.maximum(m, tl.max(s, 1))
        if t0 + BLOCK_D >= ld:  # the document's last tile: its scores are complete
            per_token = tl.where(q_live & (m > float("-inf")), m, 0.0)
            score = tl.sum(tl.reshape(per_token, [QUERIES, BLOCK_Q]), 1)
            key = score if LARGEST else -score
            worst = tl.min(best, 1)
            slot = tl.argmin(best, 1)
            # the new key takes the worst slot if it beats it (earlier documents win ties)
            take = (lanes[None, :] == slot[:, None]) & (key[:, None] > worst[:, None])
            best = tl.where(take, key[:, None], best)
            best_idx = tl.where(take, j, best_idx)
            m = tl.full([QUERIES * BLOCK_Q], float("-inf"), tl.float32)
    qs = g * QUERIES + tl.arange(0, QUERIES)
    out = (qs.to(tl.int64)[:, None] * n_prog + p) * K_PAD + lanes[None, :]
    ok = (qs < nq)[:, None]
    tl.store(OUT_KEY + out, best, mask=ok)
    tl.store(OUT_IDX + out, best_idx, mask=ok)
