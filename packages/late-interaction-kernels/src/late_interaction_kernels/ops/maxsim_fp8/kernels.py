"""Triton kernel of FP8 MaxSim inference.

Program ``i * Nd + j`` scores query ``i`` against document ``j``: query tiles of ``BLOCK_Q`` tokens
against document tiles of ``BLOCK_D`` tokens, one ``tl.dot`` on the stored 8-bit operands with a
float32 accumulator. The same kernel runs fp16/fp32 operands, which is how the Triton interpreter (it
has no 8-bit floats) tests the tiling, masking and scale handling on CPU.

At 8 bits the tensor cores are fast enough that the per-element work after the dot decides the
speed, so the kernel keeps it to one instruction where it can:

* the running maximum is elementwise over the ``(BLOCK_Q, BLOCK_D)`` tile (one NaN-propagating
  ``max`` per element) and is reduced over the document axis once per document, not per tile;
* per-tensor scales and the query's per-token scale are applied after that reduction (a valid
  scale is ``>= 0``, so it commutes with the maximum); only a per-token document scale multiplies
  every element;
* the column mask is applied only on the document's last, partial tile (and on every tile when a
  document mask is given).

A scale that is negative, NaN or infinite is read as NaN, so every score that uses it is NaN
(``reference.valid_scale`` is the same rule in PyTorch).
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_dispatch import autotune, config_space

from ..maxsim.running_max import max_nan
from ..tiles import dot_rows, load_rows

# Tuned per (query tile, embedding tile, scale kind): the best document tile and warp count move
# with the register footprint of the (BLOCK_Q, BLOCK_D) accumulator.
_CONFIGS = config_space({"BLOCK_D": [64, 128]}, num_warps=[4, 8], num_stages=[3])
_INTERPRET_CONFIG = triton.Config({"BLOCK_D": 16}, num_warps=4, num_stages=1)


@triton.jit
def _valid_scale(s):
    # x - x is 0 only for finite x: inf, NaN and negative scales become NaN
    return tl.where((s - s == 0) & (s >= 0), s, float("nan"))


@triton.jit
def _fold_tile(
    acc, q, D, SD, DM, j, t0, ld, dim, cols, ks, k_ok,
    D_PER_TOKEN: tl.constexpr, HAS_DM: tl.constexpr, MASKED: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    t = t0 + cols
    t_ok = t < ld
    x = load_rows(D, j * ld + t, t_ok, ks, k_ok, dim, False)
    s = dot_rows(q, x, IEEE)
    if D_PER_TOKEN:
        sd = _valid_scale(tl.load(SD + j * ld + t, mask=t_ok, other=0.0))
        s = s * sd[None, :]
    if HAS_DM:
        t_ok = t_ok & (tl.load(DM + j * ld + t, mask=t_ok, other=0) != 0)
    if MASKED or HAS_DM:
        s = tl.where(t_ok[None, :], s, float("-inf"))
    # NaN wins, so a NaN token or scale reaches the score as it does in the reference
    return max_nan(acc, s)


@autotune(
    _CONFIGS,
    key=["BLOCK_Q", "BLOCK_K", "D_PER_TOKEN", "HAS_DM"],
    interpret_config=_INTERPRET_CONFIG,
)
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
    full = (ld // BLOCK_D) * BLOCK_D
    total = tl.zeros([BLOCK_Q], tl.float32)
    for q0 in range(0, lq, BLOCK_Q):
        rows = q0 + tl.arange(0, BLOCK_Q)
        row_ok = rows < lq
        q = load_rows(Q, i * lq + rows, row_ok, ks, k_ok, dim, False)
        if Q_PER_TOKEN:
            scale = _valid_scale(tl.load(SQ + i * lq + rows, mask=row_ok, other=0.0))
        else:
            scale = tl.zeros([BLOCK_Q], tl.float32) + _valid_scale(tl.load(SQ))
        if not D_PER_TOKEN:
            scale = scale * _valid_scale(tl.load(SD))
        live = row_ok
        if HAS_QM:
            live = live & (tl.load(QM + i * lq + rows, mask=row_ok, other=0) != 0)
        acc = tl.full([BLOCK_Q, BLOCK_D], float("-inf"), tl.float32)
        for t0 in range(0, full, BLOCK_D):
            acc = _fold_tile(
                acc, q, D, SD, DM, j, t0, ld, dim, cols, ks, k_ok,
                D_PER_TOKEN, HAS_DM, False, IEEE,
            )  # fmt: skip
        if full < ld:
            acc = _fold_tile(
                acc, q, D, SD, DM, j, full, ld, dim, cols, ks, k_ok,
                D_PER_TOKEN, HAS_DM, True, IEEE,
            )  # fmt: skip
        best = tl.reduce(acc, 1, max_nan)
        # a query token with no valid document token adds 0, whatever its scale
        total += tl.where(live & (best != float("-inf")), best * scale, 0.0)
    tl.store(OUT + pid, tl.sum(total, 0))
