"""Triton kernel of FP8 MaxSim inference.

Program ``i * Nd + j`` scores query ``i`` against document ``j``: query tiles of ``BLOCK_Q`` tokens
against document tiles of ``BLOCK_D`` tokens, one ``tl.dot`` on the stored 8-bit operands with a
float32 accumulator, the scales applied to the fp32 tile (per token: a row and a column vector;
per tensor: one product loaded from memory, no host synchronisation), then a running max per query
token. The same kernel runs fp16/fp32 operands, which is how the Triton interpreter (it has no
8-bit floats) tests the tiling, masking and scale handling on CPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..maxsim.running_max import max_nan
from ..tiles import dot_rows, load_rows


@triton.jit
def fp8_maxsim_kernel(
    Q, D, SQ, SD, QM, DM, OUT,
    nd, lq, ld, dim,
    Q_PER_TOKEN: tl.constexpr, D_PER_TOKEN: tl.constexpr, HAS_QM: tl.constexpr,
    HAS_DM: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # one flat grid axis: the second axis of a CUDA grid stops at 65535 documents
    pid = tl.program_id(0).to(tl.int64)
    i = pid // nd
    j = pid % nd
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < dim
    cols = tl.arange(0, BLOCK_D)
    total = tl.zeros([BLOCK_Q], tl.float32)
    for q0 in range(0, lq, BLOCK_Q):
        rows = q0 + tl.arange(0, BLOCK_Q)
        row_ok = rows < lq
        q = load_rows(Q, i * lq + rows, row_ok, ks, k_ok, dim, False)
        if Q_PER_TOKEN:
            sq = tl.load(SQ + i * lq + rows, mask=row_ok, other=0.0)
        else:
            sq = tl.zeros([BLOCK_Q], tl.float32) + tl.load(SQ)
        live = row_ok
        if HAS_QM:
            live = live & (tl.load(QM + i * lq + rows, mask=row_ok, other=0) != 0)
        m = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        for t0 in range(0, ld, BLOCK_D):
            t = t0 + cols
            t_ok = t < ld
            x = load_rows(D, j * ld + t, t_ok, ks, k_ok, dim, False)
            s = dot_rows(q, x, IEEE)
            if D_PER_TOKEN:
                sd = tl.load(SD + j * ld + t, mask=t_ok, other=0.0)
            else:
                sd = tl.zeros([BLOCK_D], tl.float32) + tl.load(SD)
            s = s * sq[:, None] * sd[None, :]
            if HAS_DM:
                t_ok = t_ok & (tl.load(DM + j * ld + t, mask=t_ok, other=0) != 0)
            s = tl.where(t_ok[None, :], s, float("-inf"))
            # NaN wins, so a NaN token or scale reaches the score as it does in the reference
            m = max_nan(m, tl.reduce(s, 1, max_nan))
        total += tl.where(live & (m != float("-inf")), m, 0.0)
    tl.store(OUT + pid, tl.sum(total, 0))
