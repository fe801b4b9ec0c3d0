"""Triton kernel of ``maxsim_topk``: MaxSim scoring that offers each score to a running top-k.

Program ``j * Nq + q`` scores document ``j`` for query ``q`` with the forward kernel's own tile
loop, one program per (document, query) as in ``maxsim``: streaming the collection at memory
speed is the whole cost at corpus scale, and that grid streams it fastest for one query (a
document's queries run side by side and read it from L2; batches of queries take the chunked
path instead, see :data:`..maxsim_topk.FUSED_MAX_QUERIES`). Each score is then offered to its
query's running top-k in global memory (:mod:`.running_topk`); once the list holds ``k``
documents, a score below its ``k``-th best is dropped after one read of the threshold. The last
program of a query writes its results, so one launch returns them, sorted.
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_dispatch import autotune, config_space

from ..common.document_max import best_over_document
from ..common.tiles import load_rows
from .running_topk import DONE, finish, offer, pack

# H100, 1 × 100,000 × 32 × 300: 64-token tiles with a tile-wide maximum won over 128-token ones
# and the per-tile reduction; the space stays small because every config compiles the merge too
_CONFIGS = config_space({"BLOCK_D": [64], "TILE_MAX": [True]}, num_warps=[4, 8], num_stages=[3, 4])
_INTERPRET_CONFIG = triton.Config({"BLOCK_D": 16, "TILE_MAX": True}, num_warps=4, num_stages=1)


@autotune(
    _CONFIGS,
    key=["BLOCK_Q", "BLOCK_K", "NORMALIZE", "HAS_DM", "K_PAD"],
    reset_to_zero=["STATE"],
    interpret_config=_INTERPRET_CONFIG,
)
@triton.jit
def topk_kernel(
    Q, D, QM, DM, STATE, LISTS, OUT_SCORE, OUT_INDEX,
    nq, lq, ld, dim, nd, k,
    HAS_QM: tl.constexpr, HAS_DM: tl.constexpr, NORMALIZE: tl.constexpr,
    LARGEST: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, NORM_EPS: tl.constexpr,
    EVEN_K: tl.constexpr, DYNAMIC_BOUNDS: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr, K_PAD: tl.constexpr, WINDOW: tl.constexpr, SORT: tl.constexpr,
    STATE_WORDS: tl.constexpr, LIST_WORDS: tl.constexpr, BLOCK_D: tl.constexpr,
    TILE_MAX: tl.constexpr,
):  # fmt: skip
    # a document's queries are neighbours in launch order, so it is read from HBM once for all
    pid = tl.program_id(0)
    j = pid // nq
    qi = pid - j * nq
    token = tl.arange(0, BLOCK_Q)
    row_ok = token < lq
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < dim
    q_rows = qi.to(tl.int64) * lq + token
    q = load_rows(Q, q_rows, row_ok, ks, k_ok, dim, UPCAST)
    if NORMALIZE:
        qf = q.to(tl.float32)
        q_scale = 1.0 / tl.maximum(tl.sqrt(tl.sum(qf * qf, 1)), NORM_EPS)
    else:
        q_scale = tl.zeros([BLOCK_Q], tl.float32)  # unused
    best, _ = best_over_document(
        q, q_scale, D, None, DM, j, j.to(tl.int64) * ld, ld, ld, ld, dim, ks, k_ok,
        False, HAS_DM, False, UPCAST, NORMALIZE, NORM_EPS, IEEE, EVEN_K, DYNAMIC_BOUNDS,
        TILE_MAX, BLOCK_Q, BLOCK_D,
    )  # fmt: skip
    keep = row_ok & (best != float("-inf"))
    if HAS_QM:
        keep = keep & (tl.load(QM + q_rows, mask=row_ok, other=0) != 0)
    state = STATE + qi * STATE_WORDS
    topk_list = LISTS + qi.to(tl.int64) * LIST_WORDS
    offer(state, topk_list, pack(tl.sum(tl.where(keep, best, 0.0), 0), j, LARGEST), k, K_PAD,
          WINDOW, SORT)  # fmt: skip
    # the query's last program: every offer is in, merges included
    if tl.atomic_add(state + DONE, 1) == nd - 1:
        tl.debug_barrier()
        finish(state, topk_list, OUT_SCORE + qi.to(tl.int64) * k, OUT_INDEX + qi.to(tl.int64) * k,
               k, LARGEST, K_PAD, WINDOW, SORT)  # fmt: skip
