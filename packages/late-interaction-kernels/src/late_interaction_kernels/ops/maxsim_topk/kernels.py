"""Triton kernel of ``maxsim_topk``: fused MaxSim scoring and a running top-k per program.

Program ``(i, p)`` holds query ``i`` in registers, scores its run of documents one at a time
(document tiles streamed through ``tl.dot`` with a running max per query token) and keeps the
``K_PAD`` best keys seen so far in registers: a new document replaces the current worst key when it
beats it. Only the programs' candidates are written, ``(Nq, programs, K_PAD)``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..tiles import dot_rows, load_rows


@triton.jit
def topk_kernel(
    Q, D, QM, DM, OUT_KEY, OUT_IDX,
    lq, ld, dim, nd, docs_per_prog,
    HAS_QM: tl.constexpr, HAS_DM: tl.constexpr, NORMALIZE: tl.constexpr,
    LARGEST: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, NORM_EPS: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, K_PAD: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    p = tl.program_id(1)
    n_prog = tl.num_programs(1)
    rows = tl.arange(0, BLOCK_Q)
    ks = tl.arange(0, BLOCK_K)
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < lq
    k_ok = ks < dim
    q = load_rows(Q, i.to(tl.int64) * lq + rows, row_ok, ks, k_ok, dim, UPCAST)
    q_live = row_ok
    if HAS_QM:
        q_live = q_live & (tl.load(QM + i * lq + rows, mask=row_ok, other=0) != 0)
    if NORMALIZE:
        qf = q.to(tl.float32)
        q_inv = 1.0 / tl.maximum(tl.sqrt(tl.sum(qf * qf, 1)), NORM_EPS)

    lanes = tl.arange(0, K_PAD)
    best = tl.full([K_PAD], float("-inf"), tl.float32)
    best_idx = tl.full([K_PAD], -1, tl.int64)
    # int64 document offsets: Nd * Ld * d passes 2**31 on large collections
    start = p.to(tl.int64) * docs_per_prog
    count = tl.minimum(start + docs_per_prog, nd) - start
    for jj in range(0, count):
        j = start + jj
        m = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        for t0 in range(0, ld, BLOCK_D):
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
        score = tl.sum(tl.where(q_live & (m > float("-inf")), m, 0.0), 0)
        key = score if LARGEST else -score
        worst = tl.min(best, 0)
        slot = tl.argmin(best, 0)
        # compared as vectors: the new key takes the worst slot if it beats it
        take = (lanes == slot) & ((tl.zeros([K_PAD], tl.float32) + key) > worst)
        best = tl.where(take, key, best)
        best_idx = tl.where(take, j, best_idx)
    out = (i * n_prog + p) * K_PAD + lanes
    tl.store(OUT_KEY + out, best)
    tl.store(OUT_IDX + out, best_idx)
