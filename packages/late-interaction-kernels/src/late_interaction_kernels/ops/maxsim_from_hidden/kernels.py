"""Triton forward kernel of ``maxsim_from_hidden``: project, normalise and score document tiles
without writing the projected documents.

A program owns one document and a contiguous run of its ``BLOCK_T``-token tiles (a *split*). Each
tile is projected once, in registers (``H tile (BLOCK_T, h) @ W (h, d)`` with a K-loop over ``h``,
plus the bias, then row-normalised in fp32), and then scored against every query token of the
batch in ``BLOCK_Q``-row blocks. Projection is the expensive part (at ``h = 768, d = 128, Lq = 32``
it costs ~24 times the scoring of one query), so it is never repeated per query.

The running best similarity and argmax of every (query token, document, split) live in an fp32 /
int32 scratch that only this program touches (read-modify-write, no atomics); the splits of a
document are merged afterwards by a max over at most a handful of entries. Splitting a document's
tiles over programs fills the GPU when there are few documents (in-batch training) without
projecting any tile twice.
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_dispatch import autotune, config_space, tile_shared_memory
from triton_dispatch.autotune import prune_by_shared_memory

from ..common.running_max import score_tile_into_running_max
from ..common.tuning import tuning_bench

#: ``torch.nn.functional.normalize``'s floor on a token's norm.
NORM_EPS = 1e-12


def _smem(kw, num_stages, args) -> int:
    elem = args["H"].element_size()
    block_t, block_k = args["BLOCK_T"], args["BLOCK_K"]
    return tile_shared_memory(
        (block_t, kw["BLOCK_H"]), (kw["BLOCK_H"], block_k), element_size=elem, num_stages=num_stages
    ) + tile_shared_memory((kw["BLOCK_Q"], block_k), (block_t, block_k), element_size=elem)


# a small space: each shape regime compiles every config once (the K-loop makes that slow)
_CONFIGS = config_space(
    {"BLOCK_H": [64], "BLOCK_Q": [64, 128]}, num_warps=[4, 8], num_stages=[2, 3]
)
_DEFAULT = triton.Config({"BLOCK_H": 64, "BLOCK_Q": 64}, num_warps=8, num_stages=2)
_INTERPRET = triton.Config({"BLOCK_H": 16, "BLOCK_Q": 16}, num_warps=4, num_stages=1)


@triton.jit
def _project_tile(
    H, W, B, rows, row_ok, hdim, dim,
    HAS_B: tl.constexpr, NORMALIZE: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    NORM_EPS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """``normalize(H[rows] @ W + b)`` as an fp32 ``(BLOCK_T, BLOCK_K)`` tile (0 past ``dim``)."""
    k = tl.arange(0, BLOCK_K)
    k_ok = k < dim
    acc = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.float32)
    for h0 in range(0, hdim, BLOCK_H):
        hh = h0 + tl.arange(0, BLOCK_H)
        h_ok = hh < hdim
        x = tl.load(
            H + rows[:, None] * hdim + hh[None, :], mask=row_ok[:, None] & h_ok[None, :], other=0.0
        )
        w = tl.load(
            W + hh[:, None] * dim + k[None, :], mask=h_ok[:, None] & k_ok[None, :], other=0.0
        )
        if UPCAST:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        if IEEE:
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
    if HAS_B:
        acc += tl.load(B + k, mask=k_ok, other=0.0).to(tl.float32)[None, :]
    if NORMALIZE:
        acc = acc * (1.0 / tl.maximum(tl.sqrt(tl.sum(acc * acc, 1)), NORM_EPS))[:, None]
    return acc


@autotune(
    _CONFIGS,
    default=_DEFAULT,
    key=["BLOCK_T", "BLOCK_K", "H_BUCKET", "Q_BUCKET", "HAS_B", "HAS_DM", "NORMALIZE",
         "SAVE_ARGMAX"],
    prune=prune_by_shared_memory(_smem, device_arg="H"),
    interpret_config=_INTERPRET,
    do_bench=tuning_bench,
)  # fmt: skip
@triton.jit
def from_hidden_fwd_kernel(
    Q, H, W, B, DM, BEST, ARGMAX,
    q_rows, n_doc, lq, ld, hdim, dim, n_splits, tiles_per_split, H_BUCKET, Q_BUCKET,
    HAS_B: tl.constexpr, HAS_DM: tl.constexpr, NORMALIZE: tl.constexpr,
    SAVE_ARGMAX: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, NORM_EPS: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_Q: tl.constexpr,
):  # fmt: skip
    """``BEST[qi, doc, split, t]``: best similarity of query token ``(qi, t)`` over the split's
    valid tokens (-inf: none); ``ARGMAX``: the document-local index of the first one reaching it."""
    doc = tl.program_id(0)
    split = tl.program_id(1)
    for tt in range(0, tiles_per_split):
        cols = (split * tiles_per_split + tt) * BLOCK_T + tl.arange(0, BLOCK_T)
        col_ok = cols < ld
        p = _project_tile(
            H, W, B, doc.to(tl.int64) * ld + cols, col_ok, hdim, dim,
            HAS_B, NORMALIZE, UPCAST, IEEE, NORM_EPS, BLOCK_T, BLOCK_H, BLOCK_K,
        )  # fmt: skip
        if UPCAST:
            p_t = tl.trans(p)
        else:
            p_t = tl.trans(p.to(Q.dtype.element_ty))
        if HAS_DM:
            col_ok = col_ok & (
                tl.load(DM + doc.to(tl.int64) * ld + cols, mask=col_ok, other=0) != 0
            )
        score_tile_into_running_max(
            Q, p_t, cols, col_ok, BEST, ARGMAX,
            q_rows, lq, dim, n_doc * n_splits * lq, (doc.to(tl.int64) * n_splits + split) * lq,
            tt > 0, 0,
            SAVE_ARGMAX, UPCAST, IEEE, BLOCK_Q, BLOCK_K,
        )  # fmt: skip
