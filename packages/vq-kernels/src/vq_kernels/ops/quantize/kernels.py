"""Triton kernel of the nearest-code search: distance and argmin fused, never storing (B, K).

Each program takes a tile of rows and a contiguous range of codes (a K split, so that small batches
with large codebooks still fill the GPU); it walks the range in tiles of ``BLOCK_K`` codes, computes
``x·c`` with ``tl.dot`` over ``D`` in fp32 accumulation, and keeps a running minimum and its index.
A later tile replaces the running best only when strictly smaller, and ``tl.argmin`` breaks ties
inside a tile to the left, so ties resolve to the lowest index as ``torch.argmin`` does. Identical
codes get bitwise identical distances whatever the product precision (same operands, same
accumulation order), so exact ties stay ties. With one split the kernel writes the int64 codes
itself; with several, a small merge kernel walks the splits in order and keeps the first strict
minimum, which again prefers the lowest index.

fp32 inputs use three TF32 tensor-core products per tile (``tf32x3``: the operands split into a
high and a low TF32 part, only the low × low term dropped), about fp32's own rounding at several
times the speed of ``ieee`` FMA loops; plain ``tf32`` when the user allowed TF32 matmuls.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_dispatch import (
    autotune,
    config_space,
    device_facts,
    interpreter_enabled,
    padded_dim,
    prune_by_shared_memory,
    shape_bucket,
    tile_shared_memory,
)
from triton_dispatch.launch import KernelLaunch, PlanCache

# Every BLOCK_K in the space divides this, so a split's code range is whole tiles.
_MAX_BLOCK_K = 128
# A K split below this many codes costs more in the merge than it gains in parallelism.
_MIN_CODES_PER_SPLIT = 512
COSINE_EPS: tl.constexpr = tl.constexpr(1e-12)


def _smem(meta, num_stages, args):
    size = 2 if args["x_ptr"].element_size() <= 2 else 4
    return tile_shared_memory(
        (meta["BLOCK_B"], meta["BLOCK_D"]),
        (meta["BLOCK_K"], meta["BLOCK_D"]),
        element_size=size,
        num_stages=num_stages,
    )


@triton.jit
def nearest_code_scan(
    x_rows, row_mask, cb_ptr, norm_ptr, stride_cb, k_start, num_codes, K, D,
    COSINE: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """The nearest code of each row of a row tile among codes ``[k_start, k_start + num_codes)``
    (clipped to ``K``): returns the fp32 best distance ``(BLOCK_B,)`` (+inf when every distance is
    NaN) and its int32 code index.

    ``x_rows`` points at the start of each row (``(BLOCK_B, 1)`` pointers, unit stride on ``D``),
    ``cb_ptr`` at code 0 with ``stride_cb`` between codes, ``norm_ptr`` at ``‖c‖`` of code 0 in fp32.
    The scan walks the range in tiles of ``BLOCK_K`` codes and ``D`` in chunks of ``BLOCK_D``
    accumulated in fp32 by ``tl.dot``; every caller gets the same arithmetic and tie rule."""
    best = tl.full([BLOCK_B], float("inf"), tl.float32)
    best_idx = tl.zeros([BLOCK_B], tl.int32)
    d_range = tl.arange(0, BLOCK_D)
    for k_off in range(0, num_codes, BLOCK_K):
        k0 = k_start + k_off
        kk = k0 + tl.arange(0, BLOCK_K)
        k_mask = kk < K
        c_rows = cb_ptr + kk.to(tl.int64)[:, None] * stride_cb
        acc = tl.zeros([BLOCK_B, BLOCK_K], tl.float32)
        for d0 in range(0, D, BLOCK_D):
            dd = d0 + d_range
            d_mask = dd < D
            xt = tl.load(x_rows + dd[None, :], mask=row_mask[:, None] & d_mask[None, :], other=0.0)
            ct = tl.load(c_rows + dd[None, :], mask=k_mask[:, None] & d_mask[None, :], other=0.0)
            if UPCAST:
                xt = xt.to(tl.float32)
                ct = ct.to(tl.float32)
            acc = tl.dot(xt, tl.trans(ct), acc, input_precision=PRECISION)
        # ‖c‖ in fp32 from one norm launch; the per-code term follows reference.code_scores.
        norm = tl.load(norm_ptr + kk, mask=k_mask, other=1.0)
        if COSINE:
            dist = -acc * (1.0 / tl.maximum(norm, COSINE_EPS))[None, :]
        else:
            dist = (norm * norm)[None, :] - 2.0 * acc
        dist = tl.where(dist != dist, float("inf"), dist)
        dist = tl.where(k_mask[None, :], dist, float("inf"))
        tile_best = tl.min(dist, axis=1)
        tile_idx = tl.argmin(dist, axis=1, tie_break_left=True).to(tl.int32) + k0
        better = tile_best < best
        best_idx = tl.where(better, tile_idx, best_idx)
        best = tl.where(better, tile_best, best)
    return best, best_idx


@autotune(
    config_space(
        {"BLOCK_B": [64, 128], "BLOCK_K": [64, 128], "BLOCK_D": [32]},
        num_warps=[4, 8],
        num_stages=[3],
        # big tiles with 8 warps, small ones with 4: half the compile time of the full product
        where=lambda kw, warps, stages: (
            (warps == 8) == (kw["BLOCK_B"] * kw["BLOCK_K"] >= 128 * 128)
        ),
    ),
    key=["B_BUCKET", "K_BUCKET", "D_PADDED", "SPLIT_BUCKET", "COSINE", "PRECISION"],
    prune=prune_by_shared_memory(_smem),
    interpret_config=triton.Config({"BLOCK_B": 16, "BLOCK_K": 16, "BLOCK_D": 16}, num_warps=4),
)
# The shape-regime keys are plain ints read only by the autotuner: as constexprs each regime would
# compile its own copy of every config.
@triton.jit(do_not_specialize=["B_BUCKET", "K_BUCKET", "D_PADDED", "SPLIT_BUCKET"])
def nearest_code_kernel(
    x_ptr,
    cb_ptr,
    norm_ptr,
    best_d_ptr,
    best_i_ptr,
    codes_ptr,
    B,
    K,
    D,
    codes_per_split,
    stride_xb,
    stride_cb,
    COSINE: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    B_BUCKET,
    K_BUCKET,
    D_PADDED,
    SPLIT_BUCKET,
    SPLIT: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_b = tl.program_id(0)
    split = tl.program_id(1)
    rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    row_mask = rows < B
    k_start = split * codes_per_split
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xb
    best, best_idx = nearest_code_scan(
        x_rows, row_mask, cb_ptr, norm_ptr, stride_cb, k_start, codes_per_split, K, D,
        COSINE, UPCAST, PRECISION, BLOCK_B, BLOCK_K, BLOCK_D,
    )  # fmt: skip
    # A split whose every distance is inf still reports its first code, so the merge sees a code
    # inside [0, K).
    best_idx = tl.where(best == float("inf"), k_start, best_idx)
    if SPLIT:
        out = split.to(tl.int64) * B + rows
        tl.store(best_d_ptr + out, best, mask=row_mask)
        tl.store(best_i_ptr + out, best_idx, mask=row_mask)
    else:
        tl.store(codes_ptr + rows, best_idx.to(tl.int64), mask=row_mask)


@triton.jit
def merge_splits_kernel(best_d_ptr, best_i_ptr, codes_ptr, B, splits, BLOCK: tl.constexpr):
    """codes[b] = best_i[s*, b] with s* the first split holding the strict minimum of best_d[:, b]:
    splits cover increasing code ranges, so the first one wins ties (the lowest index)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = rows < B
    best = tl.full([BLOCK], float("inf"), tl.float32)
    idx = tl.load(best_i_ptr + rows, mask=m, other=0)
    for s in range(0, splits):
        d = tl.load(best_d_ptr + s * B + rows, mask=m, other=float("inf"))
        i = tl.load(best_i_ptr + s * B + rows, mask=m, other=0)
        better = d < best
        idx = tl.where(better, i, idx)
        best = tl.where(better, d, best)
    tl.store(codes_ptr + rows, idx.to(tl.int64), mask=m)


def k_splits(batch: int, num_codes: int, device: torch.device) -> int:
    """How many K splits the search of ``batch`` rows in ``num_codes`` codes uses by default.

    K is split only when the rows alone give too few programs *and* each split keeps enough codes
    to amortise the merge; small codebooks never split (one launch, no merge)."""
    row_tiles = triton.cdiv(batch, 64)
    target = 1 if interpreter_enabled() else 2 * device_facts(device).sm_count
    return max(1, min(triton.cdiv(target, row_tiles), triton.cdiv(num_codes, _MIN_CODES_PER_SPLIT)))


class NearestCodePlan:
    """The launch of one kind of nearest-code call (sizes, dtype, device, metric, precision,
    strides): K split, tuned config and grid resolved once; a call allocates and launches."""

    def __init__(self, batch, num_codes, dim, dtype, device, metric, stride_xb, stride_cb, splits):
        interpreting = interpreter_enabled()
        if splits is None:
            splits = k_splits(batch, num_codes, device)
        splits = max(1, min(triton.cdiv(num_codes, _MAX_BLOCK_K), splits))
        per_split = triton.cdiv(triton.cdiv(num_codes, splits), _MAX_BLOCK_K) * _MAX_BLOCK_K
        self.splits = splits = triton.cdiv(num_codes, per_split)
        self.batch, self.device = batch, device
        if interpreting or dtype != torch.float32:
            precision = "ieee"  # bf16/fp16 products are exact in fp32 accumulation anyway
        else:
            precision = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "tf32x3"
        self.launch = KernelLaunch(
            nearest_code_kernel,
            lambda meta: (triton.cdiv(batch, meta["BLOCK_B"]), splits),
            dict(
                B=batch, K=num_codes, D=dim, codes_per_split=per_split, stride_xb=stride_xb,
                stride_cb=stride_cb, COSINE=metric == "cosine",
                UPCAST=interpreting or dtype == torch.float32, PRECISION=precision,
                B_BUCKET=shape_bucket(batch, minimum=64, maximum=1 << 16),
                K_BUCKET=shape_bucket(num_codes, minimum=64, maximum=1 << 16),
                D_PADDED=padded_dim(dim), SPLIT_BUCKET=shape_bucket(splits), SPLIT=splits > 1,
            ),
            device=device,
        )  # fmt: skip
        if splits > 1:
            block = 128 if interpreting else 1024
            self.merge = KernelLaunch(
                merge_splits_kernel,
                (triton.cdiv(batch, block),),
                dict(B=batch, splits=splits, BLOCK=block),
                device=device,
                options={"num_warps": 4},
            )

    def __call__(self, x, codebook, norms) -> torch.Tensor:
        codes = torch.empty(self.batch, device=self.device, dtype=torch.int64)
        if self.splits == 1:
            self.launch(x, codebook, norms, codes, codes, codes)  # no split buffers to fill
            return codes
        best_d = torch.empty(self.splits, self.batch, device=self.device, dtype=torch.float32)
        best_i = torch.empty(self.splits, self.batch, device=self.device, dtype=torch.int32)
        self.launch(x, codebook, norms, best_d, best_i, codes)
        self.merge(best_d, best_i, codes)
        return codes


_PLANS: PlanCache[NearestCodePlan] = PlanCache("vq_kernels.nearest_code")


def nearest_code(
    x: torch.Tensor,
    codebook: torch.Tensor,
    norms: torch.Tensor,
    metric: str,
    *,
    splits: int | None = None,
):
    """Nearest code per row (B,) int64. x (B, D) and codebook (K, D) of one dtype, unit stride on
    D; norms (K,) fp32 ``‖c‖`` of the codebook as cast to x's dtype. ``splits`` overrides the K
    split (tests)."""
    (batch, dim), num_codes = x.shape, codebook.shape[0]
    meta = (
        batch, num_codes, dim, x.dtype, x.device, metric, x.stride(0), codebook.stride(0), splits,
        torch.backends.cuda.matmul.allow_tf32,
    )  # fmt: skip
    plan = _PLANS.get(meta, lambda: NearestCodePlan(*meta[:-1]))
    return plan(x, codebook, norms)


class NearestCodeSearch:
    """The plan of ``vq_kernels::nearest_code`` for one kind of one-nearest search: the codebook
    cast to x's dtype, its norms, and the launch, whose own plan follows each call's strides and
    the TF32 setting."""

    def __init__(self, metric: str, cast: bool) -> None:
        self.metric, self.cast = metric, cast

    def forward(self, x: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
        cb = codebook.to(x.dtype) if self.cast else codebook
        if x.stride(-1) != 1:
            x = x.contiguous()
        if cb.stride(-1) != 1:
            cb = cb.contiguous()
        # One launch for the per-code term; the kernel turns ‖c‖ into ‖c‖² or 1/‖c‖.
        norms = torch.linalg.vector_norm(cb, dim=-1, dtype=torch.float32)
        return nearest_code(x, cb, norms, self.metric)


def nearest_code_plan(call) -> NearestCodeSearch | None:
    """The plan of a validated ``nearest_code`` call, or ``None`` where the reference runs it:
    ``k > 1`` (a chunked PyTorch search), float64 and empty batches."""
    x, codebook = call["x"], call["codebook"]
    if call["k"] != 1 or x.dtype == torch.float64 or x.shape[0] == 0:
        return None
    return NearestCodeSearch(call["metric"], codebook.dtype != x.dtype)
