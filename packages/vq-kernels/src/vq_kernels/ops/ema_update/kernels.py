"""Triton kernels of the EMA codebook update.

Two phases, so that the work is batch-parallel at every size and a distributed caller can
all-reduce between them:

* statistics: either a batch-parallel scatter (each program takes a tile of rows and adds them to
  their codes with atomics), or, in deterministic mode, a per-code segment reduction over the rows
  sorted by code (no atomics, a fixed summation order, bitwise reproducible);
* epilogue: one program per block of codes does the EMA blend, the codebook refresh, the counter
  and the dead-code restart, reading each code's state once.

On CUDA the common case (active-only, no process group, atomics allowed) runs both phases in one
cooperative launch, ``fused_update_kernel``, whose persistent programs meet at a grid-wide barrier
between them: a training-size update is mostly launch overhead, and this halves the launches.
The phase bodies are shared ``@triton.jit`` helpers, so the interpreter tests them through the
two-kernel path as well as through the fused kernel run by a single program.

All state is fp32; ``x`` may be fp32, fp16 or bf16 and is upcast on load.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_dispatch import device_facts, padded_dim
from triton_dispatch.compile_ahead import wait_for
from triton_dispatch.launch import KernelLaunch

from .reference import reset_cluster_size

# Rows × padded columns held by one scatter program: enough to hide latency, small enough for
# registers.
_SCATTER_TILE = 4096


@triton.jit
def _row_is_finite(tile):
    bad = (tile != tile) | (tl.abs(tile) == float("inf"))
    return tl.sum(bad.to(tl.int32), axis=1) == 0


# The kernels launch with fixed, shape-derived blocks rather than through an autotuner: they are
# memory-bound with little to tune, and at training batch sizes the autotuner's per-call
# bookkeeping is a visible part of the whole update.
@triton.jit
def _scatter_rows(
    x_ptr,
    codes_ptr,
    counts_ptr,
    sums_ptr,
    tile,
    level,
    B,
    D,
    K,
    SINGLE_TILE: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Add rows ``tile·BLOCK_B …`` of level ``level`` of x (L·B, D) to their codes' counts and sums.

    A row holding a NaN/inf, or a code outside [0, K), is skipped. When D does not fit one tile the
    row is read twice: once to check it is finite, once to add it (the second read hits L2).
    """
    rows = tile * BLOCK_B + tl.arange(0, BLOCK_B)
    row_mask = rows < B
    code = tl.load(codes_ptr + level * B + rows, mask=row_mask, other=-1).to(tl.int64)
    keep = row_mask & (code >= 0) & (code < K)
    x_rows = x_ptr + (level * B + rows).to(tl.int64)[:, None] * D
    target = level * K + code
    cols = tl.arange(0, BLOCK_D)
    if SINGLE_TILE:
        m = keep[:, None] & (cols[None, :] < D)
        tile_x = tl.load(x_rows + cols[None, :], mask=m, other=0.0).to(tl.float32)
        keep = keep & _row_is_finite(tile_x)
        tl.atomic_add(
            sums_ptr + target[:, None] * D + cols[None, :],
            tile_x,
            mask=keep[:, None] & (cols[None, :] < D),
            sem="relaxed",
        )
    else:
        for d0 in range(0, D, BLOCK_D):
            c = d0 + cols
            m = keep[:, None] & (c[None, :] < D)
            tile_x = tl.load(x_rows + c[None, :], mask=m, other=0.0).to(tl.float32)
            keep = keep & _row_is_finite(tile_x)
        for d0 in range(0, D, BLOCK_D):
            c = d0 + cols
            m = keep[:, None] & (c[None, :] < D)
            tile_x = tl.load(x_rows + c[None, :], mask=m, other=0.0).to(tl.float32)
            tl.atomic_add(
                sums_ptr + target[:, None] * D + c[None, :], tile_x, mask=m, sem="relaxed"
            )
    tl.atomic_add(
        counts_ptr + target, tl.full([BLOCK_B], 1.0, tl.float32), mask=keep, sem="relaxed"
    )


@triton.jit
def scatter_statistics_kernel(
    x_ptr,
    codes_ptr,
    counts_ptr,
    sums_ptr,
    B,
    D,
    K,
    SINGLE_TILE: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """x (L·B, D) contiguous, codes (L·B,) → counts (L·K,), sums (L·K, D) by atomic adds; grid
    (row tiles, L)."""
    _scatter_rows(
        x_ptr,
        codes_ptr,
        counts_ptr,
        sums_ptr,
        tl.program_id(0),
        tl.program_id(1),
        B,
        D,
        K,
        SINGLE_TILE,
        BLOCK_B,
        BLOCK_D,
    )


@triton.jit
def sort_keys_kernel(
    x_ptr, codes_ptr, keys_ptr, B, D, K, LB, SKIP, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr
):
    """keys[l·B + b] = l·K + codes[l, b] for rows that count, SKIP (= L·K, sorted last) for rows
    holding a NaN/inf or a code outside [0, K): the sort keys of the deterministic mode in one
    pass over x."""
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    m = rows < LB
    code = tl.load(codes_ptr + rows, mask=m, other=-1).to(tl.int64)
    keep = m & (code >= 0) & (code < K)
    cols = tl.arange(0, BLOCK_D)
    for d0 in range(0, D, BLOCK_D):
        c = d0 + cols
        tile = tl.load(
            x_ptr + rows.to(tl.int64)[:, None] * D + c[None, :],
            mask=keep[:, None] & (c[None, :] < D),
            other=0.0,
        ).to(tl.float32)
        keep = keep & _row_is_finite(tile)
    key = tl.where(keep, (rows // B).to(tl.int64) * K + code, SKIP)
    tl.store(keys_ptr + rows, key.to(keys_ptr.dtype.element_ty), mask=m)


@triton.jit
def segment_statistics_kernel(
    x_ptr,
    order_ptr,
    offsets_ptr,
    counts_ptr,
    sums_ptr,
    D,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Deterministic statistics: program (code, column block) sums the rows
    ``order[offsets[code]:offsets[code+1]]`` of x (L·B, D) in a fixed order, without atomics."""
    code = tl.program_id(0)
    pid_d = tl.program_id(1)
    start = tl.load(offsets_ptr + code)
    end = tl.load(offsets_ptr + code + 1)
    cols = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    col_mask = cols < D
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for i0 in range(start, end, BLOCK_R):
        idx = i0 + tl.arange(0, BLOCK_R)
        m = idx < end
        row = tl.load(order_ptr + idx, mask=m, other=0).to(tl.int64)
        tile = tl.load(
            x_ptr + row[:, None] * D + cols[None, :], mask=m[:, None] & col_mask[None, :], other=0.0
        )
        acc += tl.sum(tile.to(tl.float32), axis=0)
    tl.store(sums_ptr + code.to(tl.int64) * D + cols, acc, mask=col_mask)
    if pid_d == 0:
        tl.store(counts_ptr + code, (end - start).to(tl.float32))


@triton.jit
def _code_update(
    size_ptr, counter_ptr, total_ptr, src_ptr, cand_ptr, g, gm, count, rows_per_level, K, D,
    decay, eps, threshold,
    DECAY_ALL: tl.constexpr, HAS_THRESHOLD: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """The per-code half of the epilogue of global codes ``g`` (level·K + code) given this batch's
    ``count``: new cluster size and counter, which codes blend/refresh (and the refresh divisor),
    and which restart from which source row."""
    size = tl.load(size_ptr + g, mask=gm, other=0.0)
    counter = tl.load(counter_ptr + g, mask=gm, other=0)
    active = count > 0
    blended_size = decay * size + (1.0 - decay) * count
    if DECAY_ALL:
        new_size = blended_size
        total = tl.load(total_ptr + g // K, mask=gm, other=0.0)
        refresh = total > 0
        denom = (new_size + eps) / (total + K * eps) * total
        blend = gm
    else:
        new_size = tl.where(active, blended_size, size)
        refresh = active
        # NaN state stays NaN, as torch's clamp_min has it (fmax on the GPU would drop it)
        denom = tl.maximum(new_size, eps, propagate_nan=tl.PropagateNan.ALL)
        blend = active
    denom = tl.where(refresh, denom, 1.0)
    new_counter = tl.where(active, 0, counter + 1)
    cand = tl.load(cand_ptr + g, mask=gm, other=0).to(tl.int64)
    row = (g // K).to(tl.int64) * rows_per_level + tl.minimum(
        tl.maximum(cand, 0), rows_per_level - 1
    )
    if HAS_THRESHOLD:
        if DECAY_ALL:
            dead = gm & (new_size < threshold)
        else:
            dead = gm & (new_counter >= threshold)
        # A restart needs the whole replacement row finite; check it before writing anything.
        cols = tl.arange(0, BLOCK_D)
        for d0 in range(0, D, BLOCK_D):
            c = d0 + cols
            m = dead[:, None] & (c[None, :] < D)
            r = tl.load(src_ptr + row[:, None] * D + c[None, :], mask=m, other=0.0).to(tl.float32)
            dead = dead & _row_is_finite(r)
        replaced = dead
    else:
        replaced = gm & (count != count)  # all False, typed like a mask
    return new_size, new_counter, refresh, denom, blend, replaced, row


@triton.jit
def _rows_update(
    codebook_ptr, sum_ptr, src_ptr, g, gm, c, batch_sum, refresh, denom, blend, replaced, row, D,
    decay, reset_size,
):  # fmt: skip
    """The per-row half of the epilogue, for columns ``c``: EMA of the sums, codebook refresh,
    restarts from the source rows."""
    m = gm[:, None] & (c[None, :] < D)
    off = g.to(tl.int64)[:, None] * D + c[None, :]
    old_sum = tl.load(sum_ptr + off, mask=m, other=0.0)
    new_sum = tl.where(blend[:, None], decay * old_sum + (1.0 - decay) * batch_sum, old_sum)
    old_code = tl.load(codebook_ptr + off, mask=m, other=0.0).to(tl.float32)
    new_code = tl.where(refresh[:, None], new_sum / denom[:, None], old_code)
    r = tl.load(src_ptr + row[:, None] * D + c[None, :], mask=m & replaced[:, None], other=0.0)
    r = r.to(tl.float32)
    new_code = tl.where(replaced[:, None], r, new_code)
    new_sum = tl.where(replaced[:, None], r * reset_size, new_sum)
    tl.store(sum_ptr + off, new_sum, mask=m)
    tl.store(codebook_ptr + off, new_code.to(codebook_ptr.dtype.element_ty), mask=m)


@triton.jit
def _code_store(
    size_ptr, counter_ptr, replaced_ptr, g, gm, new_size, new_counter, replaced, reset_size
):
    tl.store(size_ptr + g, tl.where(replaced, reset_size, new_size), mask=gm)
    new_counter = tl.where(replaced, 0, new_counter).to(counter_ptr.dtype.element_ty)
    tl.store(counter_ptr + g, new_counter, mask=gm)
    tl.store(replaced_ptr + g, replaced, mask=gm)


@triton.jit
def _epilogue_codes(
    codebook_ptr, size_ptr, sum_ptr, counter_ptr, counts_ptr, sums_ptr, total_ptr, src_ptr,
    cand_ptr, replaced_ptr, block, rows_per_level, LK, K, D, decay, eps, threshold, reset_size,
    DECAY_ALL: tl.constexpr, HAS_THRESHOLD: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """The epilogue of codes ``block·BLOCK_K …`` of all L·K codes from the batch statistics in
    memory; see ``reference.ema_apply_reference_`` for the math. The statistics are loaded past L1
    (``.cg``): in the fused kernel other programs' atomics wrote them during this launch."""
    g = block * BLOCK_K + tl.arange(0, BLOCK_K)
    gm = g < LK
    count = tl.load(counts_ptr + g, mask=gm, other=0.0, cache_modifier=".cg")
    new_size, new_counter, refresh, denom, blend, replaced, row = _code_update(
        size_ptr, counter_ptr, total_ptr, src_ptr, cand_ptr, g, gm, count, rows_per_level, K, D,
        decay, eps, threshold, DECAY_ALL, HAS_THRESHOLD, BLOCK_D,
    )  # fmt: skip
    cols = tl.arange(0, BLOCK_D)
    for d0 in range(0, D, BLOCK_D):
        c = d0 + cols
        off = g.to(tl.int64)[:, None] * D + c[None, :]
        m = gm[:, None] & (c[None, :] < D)
        batch_sum = tl.load(sums_ptr + off, mask=m, other=0.0, cache_modifier=".cg")
        _rows_update(
            codebook_ptr, sum_ptr, src_ptr, g, gm, c, batch_sum, refresh, denom, blend, replaced,
            row, D, decay, reset_size,
        )  # fmt: skip
    _code_store(
        size_ptr, counter_ptr, replaced_ptr, g, gm, new_size, new_counter, replaced, reset_size
    )


@triton.jit
def small_update_kernel(
    x_ptr, codes_ptr, codebook_ptr, size_ptr, sum_ptr, counter_ptr, cand_ptr, replaced_ptr,
    B, K, D, decay, eps, threshold,
    HAS_THRESHOLD: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """The whole active-only update of one code, no atomics and no scratch: program (code, level)
    scans the level's codes (ints only), loads just the rows assigned to its code (masked loads
    fetch nothing else, and a chunk without one is skipped), sums them and runs the epilogue from
    registers. Every program reads all B codes, so the work grows with B·K: the launcher uses it
    only below a measured crossover with the scatter. ``D <= BLOCK_D``."""
    level = tl.program_id(1)
    k = tl.program_id(0) + tl.arange(0, 1)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    count = tl.zeros([1], dtype=tl.float32)
    batch_sum = tl.zeros([BLOCK_D], dtype=tl.float32)
    for b0 in range(0, B, BLOCK_B):
        rows = b0 + tl.arange(0, BLOCK_B)
        code = tl.load(codes_ptr + level * B + rows, mask=rows < B, other=-1)
        match = code == k
        if tl.max(match.to(tl.int32), 0) > 0:
            tile = tl.load(
                x_ptr + (level * B + rows).to(tl.int64)[:, None] * D + cols[None, :],
                mask=match[:, None] & col_ok[None, :],
                other=0.0,
            ).to(tl.float32)
            keep = match & _row_is_finite(tile)
            count += tl.sum(keep.to(tl.float32), 0)
            batch_sum += tl.sum(tl.where(keep[:, None], tile, 0.0), 0)
    g = level * K + k
    gm = k < K
    new_size, new_counter, refresh, denom, blend, replaced, row = _code_update(
        size_ptr, counter_ptr, size_ptr, x_ptr, cand_ptr, g, gm, count, B, K, D, decay, eps,
        threshold, False, HAS_THRESHOLD, BLOCK_D,
    )  # fmt: skip
    _rows_update(
        codebook_ptr, sum_ptr, x_ptr, g, gm, cols, batch_sum[None, :], refresh, denom, blend,
        replaced, row, D, decay, 1.0,
    )  # fmt: skip
    _code_store(size_ptr, counter_ptr, replaced_ptr, g, gm, new_size, new_counter, replaced, 1.0)


@triton.jit
def ema_epilogue_kernel(
    codebook_ptr, size_ptr, sum_ptr, counter_ptr, counts_ptr, sums_ptr, total_ptr, src_ptr,
    cand_ptr, replaced_ptr, rows_per_level, LK, K, D, decay, eps, threshold, reset_size,
    DECAY_ALL: tl.constexpr, HAS_THRESHOLD: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Per-code epilogue over all L·K codes, one block of codes per program."""
    _epilogue_codes(
        codebook_ptr, size_ptr, sum_ptr, counter_ptr, counts_ptr, sums_ptr, total_ptr, src_ptr,
        cand_ptr, replaced_ptr, tl.program_id(0), rows_per_level, LK, K, D, decay, eps, threshold,
        reset_size, DECAY_ALL, HAS_THRESHOLD, BLOCK_K, BLOCK_D,
    )  # fmt: skip


@triton.jit
def fused_update_kernel(
    x_ptr, codes_ptr, scratch_ptr, codebook_ptr, size_ptr, sum_ptr, counter_ptr, cand_ptr,
    replaced_ptr, B, LK, K, D, decay, eps, threshold,
    HAS_THRESHOLD: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    SINGLE_TILE: tl.constexpr, SCATTER_B: tl.constexpr, SCATTER_D: tl.constexpr,
):  # fmt: skip
    """Active-only statistics and epilogue in one launch (non-distributed updates): a cooperative
    grid of persistent programs scatters every row tile, meets at a grid-wide barrier, then runs
    the epilogue over every block of codes. Must be launched with ``launch_cooperative_grid=True``
    (all programs resident, or the launch fails) and ``scratch`` zeroed: fp32 counts (L·K), sums
    (L·K, D) and the barrier counter (int32 zeros are fp32 zeros), one allocation so that a call
    passes one pointer."""
    counts_ptr = scratch_ptr
    sums_ptr = scratch_ptr + LK
    barrier_ptr = (scratch_ptr + tl.cast(LK, tl.int64) * (D + 1)).to(tl.pointer_type(tl.int32))
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    levels = LK // K
    row_tiles = tl.cdiv(B, SCATTER_B)
    for t in range(pid, row_tiles * levels, nprog):
        _scatter_rows(
            x_ptr, codes_ptr, counts_ptr, sums_ptr, t % row_tiles, t // row_tiles, B, D, K,
            SINGLE_TILE, SCATTER_B, SCATTER_D,
        )  # fmt: skip
    # Grid barrier (the cooperative-groups pattern): every thread's atomics are issued before the
    # CTA barrier; one release increment per program publishes them; the acquire spin waits for
    # every program.
    tl.debug_barrier()
    tl.atomic_add(barrier_ptr, 1, sem="release", scope="gpu")
    arrived = tl.atomic_add(barrier_ptr, 0, sem="acquire", scope="gpu")
    while arrived < nprog:
        arrived = tl.atomic_add(barrier_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()
    for blk in range(pid, tl.cdiv(LK, BLOCK_K), nprog):
        # the decay-all total (unused: active-only) is any fp32 pointer; rows come from x
        _epilogue_codes(
            codebook_ptr, size_ptr, sum_ptr, counter_ptr, counts_ptr, sums_ptr, size_ptr, x_ptr,
            cand_ptr, replaced_ptr, blk, B, LK, K, D, decay, eps, threshold, 1.0, False,
            HAS_THRESHOLD, BLOCK_K, BLOCK_D,
        )  # fmt: skip


def scatter_statistics(
    x: torch.Tensor, codes: torch.Tensor, num_codes: int, one_buffer: bool = False
):
    """Counts (L, K) and sums (L, K, D) in fp32 with the atomic scatter kernel.

    x (L, B, D) contiguous, codes (L, B) contiguous, B ≥ 1. ``one_buffer``: both are views of a
    single allocation, zero-filled by one launch instead of two (a launch costs microseconds of
    host time, a visible part of a training-size update).
    """
    levels, _, dim = x.shape
    if one_buffer:
        scratch = torch.zeros(levels * num_codes * (dim + 1), device=x.device, dtype=torch.float32)
        counts = scratch[: levels * num_codes].view(levels, num_codes)
        sums = scratch[levels * num_codes :].view(levels, num_codes, dim)
    else:
        counts = torch.zeros(levels, num_codes, device=x.device, dtype=torch.float32)
        sums = torch.zeros(levels, num_codes, dim, device=x.device, dtype=torch.float32)
    scatter_statistics_into(x, codes, counts, sums)
    return counts, sums


def scatter_statistics_into(
    x: torch.Tensor, codes: torch.Tensor, counts: torch.Tensor, sums: torch.Tensor
) -> None:
    """Add the counts and sums of ``x (L, B, D)`` (contiguous, B >= 1) into zero-filled fp32
    ``counts (L, K)`` and ``sums (L, K, D)`` (contiguous views, e.g. of a collective's buffer)."""
    levels, batch, dim = x.shape
    num_codes = counts.shape[-1]
    block_b, block_d = _scatter_blocks(dim)
    grid = (triton.cdiv(batch, block_b), levels)
    scatter_statistics_kernel[grid](
        x,
        codes,
        counts,
        sums,
        batch,
        dim,
        num_codes,
        SINGLE_TILE=dim <= block_d,
        BLOCK_B=block_b,
        BLOCK_D=block_d,
        num_warps=4,
    )


def segment_statistics(x: torch.Tensor, codes: torch.Tensor, num_codes: int):
    """Deterministic counts and sums: rows sorted by (level, code) with a stable sort, then one
    program per code reduces its rows in order. No atomics; bitwise reproducible."""
    levels, batch, dim = x.shape
    total = levels * num_codes
    # int32 keys halve the radix-sort passes of int64 ones; total + 1 (the key of skipped rows)
    # always fits for codebooks that fit in memory.
    key_dtype = torch.int32 if total < 2**31 - 1 else torch.int64
    keys = torch.empty(levels * batch, device=x.device, dtype=key_dtype)
    block_b, block_d = _scatter_blocks(dim)
    sort_keys_kernel[(triton.cdiv(levels * batch, block_b),)](
        x,
        codes,
        keys,
        batch,
        dim,
        num_codes,
        levels * batch,
        total,
        BLOCK_B=block_b,
        BLOCK_D=block_d,
        num_warps=4,
    )
    sorted_keys, order = torch.sort(keys, stable=True)
    bounds = torch.arange(total + 1, device=x.device, dtype=key_dtype)
    offsets = torch.searchsorted(sorted_keys, bounds)
    counts = torch.empty(levels * num_codes, device=x.device, dtype=torch.float32)
    sums = torch.empty(levels * num_codes, dim, device=x.device, dtype=torch.float32)
    block_d = min(padded_dim(dim), 16 if triton_interpreting() else 128)
    block_r = 8 if triton_interpreting() else 32
    grid = (levels * num_codes, triton.cdiv(dim, block_d))
    segment_statistics_kernel[grid](
        x, order, offsets, counts, sums, dim, BLOCK_R=block_r, BLOCK_D=block_d, num_warps=4
    )
    return counts.view(levels, num_codes), sums.view(levels, num_codes, dim)


def ema_epilogue(
    codebook: torch.Tensor,
    cluster_size: torch.Tensor,
    embed_sum: torch.Tensor,
    counter: torch.Tensor,
    counts: torch.Tensor,
    sums: torch.Tensor,
    src: torch.Tensor,
    candidates: torch.Tensor,
    rows_per_level: int,
    *,
    decay: float,
    eps: float,
    semantics: str,
    threshold: float | None,
    reset_size: float,
) -> torch.Tensor:
    """Run the epilogue in place on contiguous state; returns the bool replaced mask (L, K).

    The replacement row of code ``k`` of level ``l`` is ``src[l · rows_per_level + candidates[l, k]]``
    (src is (rows, D)).
    """
    levels, num_codes, dim = codebook.shape
    replaced = torch.empty(levels, num_codes, device=codebook.device, dtype=torch.bool)
    decay_all = semantics == "decay_all"
    if decay_all:
        total = (decay * cluster_size + (1.0 - decay) * counts).sum(-1)
    else:
        total = cluster_size  # unused
    block_k, block_d = _epilogue_blocks(dim)
    ema_epilogue_kernel[(triton.cdiv(levels * num_codes, block_k),)](
        codebook,
        cluster_size,
        embed_sum,
        counter,
        counts,
        sums,
        total,
        src,
        candidates,
        replaced,
        rows_per_level,
        levels * num_codes,
        num_codes,
        dim,
        float(decay),
        float(eps),
        float(threshold) if threshold is not None else 0.0,
        float(reset_size),
        DECAY_ALL=decay_all,
        HAS_THRESHOLD=threshold is not None,
        BLOCK_K=block_k,
        BLOCK_D=block_d,
        num_warps=4,
    )
    return replaced


def grouped_update_launches(
    levels: int,
    batch: int,
    num_codes: int,
    dim: int,
    device: torch.device,
    decay: float,
    eps: float,
    threshold: float | None,
) -> tuple[KernelLaunch, KernelLaunch]:
    """The two bound launches of an active-only update whose statistics are summed over a process
    group between them: the scatter (per call ``x, codes, counts, sums``) and the epilogue (per
    call ``codebook, cluster_size, embed_sum, counter, counts, sums, total, src, candidates,
    replaced``), with replacement rows read as ``src[l * K + candidates[l, k]]``."""
    block_b, block_d = _scatter_blocks(dim)
    scatter = KernelLaunch(
        scatter_statistics_kernel,
        (triton.cdiv(batch, block_b), levels),
        dict(B=batch, D=dim, K=num_codes, SINGLE_TILE=dim <= block_d, BLOCK_B=block_b,
             BLOCK_D=block_d),
        device=device,
        options={"num_warps": 4},
    )  # fmt: skip
    block_k, block_d = _epilogue_blocks(dim)
    epilogue = KernelLaunch(
        ema_epilogue_kernel,
        (triton.cdiv(levels * num_codes, block_k),),
        dict(
            rows_per_level=num_codes, LK=levels * num_codes, K=num_codes, D=dim,
            decay=float(decay), eps=float(eps),
            threshold=float(threshold) if threshold is not None else 0.0,
            reset_size=reset_cluster_size("active_only", threshold), DECAY_ALL=False,
            HAS_THRESHOLD=threshold is not None, BLOCK_K=block_k, BLOCK_D=block_d,
        ),
        device=device,
        options={"num_warps": 4},
    )  # fmt: skip
    return scatter, epilogue


def _scatter_blocks(dim: int) -> tuple[int, int]:
    block_d = min(padded_dim(dim), 1024)
    block_b = max(1, min(_SCATTER_TILE // block_d, 64))
    return (min(block_b, 16) if triton_interpreting() else block_b), block_d


def _epilogue_blocks(dim: int) -> tuple[int, int]:
    interpreting = triton_interpreting()
    return (16 if interpreting else 32), min(padded_dim(dim), 16 if interpreting else 128)


def fused_update(
    x: torch.Tensor,
    codes: torch.Tensor,
    codebook: torch.Tensor,
    cluster_size: torch.Tensor,
    embed_sum: torch.Tensor,
    counter: torch.Tensor,
    candidates: torch.Tensor,
    *,
    decay: float,
    eps: float,
    threshold: float | None,
    programs: int | None = None,
) -> torch.Tensor:
    """The whole active-only update of stacked levels in one cooperative launch (see
    ``fused_update_kernel``); state in place, returns the bool replaced mask (L, K).

    x (L, B, D) and codes (L, B) contiguous, B ≥ 1; candidates (L, K) in [0, B). ``programs``
    overrides the grid (tests run one program under the interpreter, where programs run one after
    another and a grid barrier between several would never open).
    """
    levels, batch, dim = x.shape
    num_codes = codebook.shape[1]
    bound, options = _fused_bound(levels, batch, num_codes, dim, decay, eps, threshold)
    regime = _fused_regime(x, codes, codebook, counter, bound)
    if programs is None:
        programs = _fused_programs(regime, bound, x.device)
    scratch = fused_update_scratch(levels, num_codes, dim, x.device)
    replaced = torch.empty(levels, num_codes, device=x.device, dtype=torch.bool)
    wait_for(fused_update_kernel)  # a compile ahead of this launch (compile_update_ahead)
    compiled = fused_update_kernel[(programs,)](
        x, codes, scratch, codebook, cluster_size, embed_sum, counter, candidates, replaced,
        **bound, **options,
    )  # fmt: skip
    if not triton_interpreting() and regime not in _RESIDENT_PER_SM:
        _RESIDENT_PER_SM[regime] = _resident_programs(compiled, _FUSED_WARPS)
    return replaced


def fused_update_scratch(levels: int, num_codes: int, dim: int, device) -> torch.Tensor:
    """The zeroed scratch of one fused update: counts, sums and the barrier counter, one fill."""
    return torch.zeros(levels * num_codes * (dim + 1) + 1, device=device, dtype=torch.float32)


def fused_update_launch(
    x: torch.Tensor,
    codes: torch.Tensor,
    codebook: torch.Tensor,
    counter: torch.Tensor,
    *,
    decay: float,
    eps: float,
    threshold: float | None,
) -> KernelLaunch | None:
    """The bound launch of ``fused_update_kernel`` for updates shaped like these tensors; per call
    it takes ``x, codes, scratch, codebook, cluster_size, embed_sum, counter, candidates,
    replaced``. ``None`` until one :func:`fused_update` of this regime has compiled the kernel
    (its residency per SM sets the grid)."""
    levels, batch, dim = x.shape
    bound, options = _fused_bound(levels, batch, codebook.shape[1], dim, decay, eps, threshold)
    regime = _fused_regime(x, codes, codebook, counter, bound)
    if regime not in _RESIDENT_PER_SM:
        return None
    programs = _fused_programs(regime, bound, x.device)
    return KernelLaunch(fused_update_kernel, (programs,), bound, device=x.device, options=options)


def _fused_regime(x, codes, codebook, counter, bound: dict) -> tuple:
    """What the compiled kernel's residency per SM depends on."""
    return (x.device, x.dtype, codes.dtype, codebook.dtype, counter.dtype, bound["SCATTER_B"],
            bound["SCATTER_D"], bound["BLOCK_D"], bound["HAS_THRESHOLD"])  # fmt: skip


def _fused_bound(levels, batch, num_codes, dim, decay, eps, threshold) -> tuple[dict, dict]:
    scatter_b, scatter_d = _scatter_blocks(dim)
    block_k, block_d = _epilogue_blocks(dim)
    bound = dict(
        B=batch, LK=levels * num_codes, K=num_codes, D=dim, decay=float(decay), eps=float(eps),
        threshold=float(threshold) if threshold is not None else 0.0,
        HAS_THRESHOLD=threshold is not None, BLOCK_K=block_k, BLOCK_D=block_d,
        SINGLE_TILE=dim <= scatter_d, SCATTER_B=scatter_b, SCATTER_D=scatter_d,
    )  # fmt: skip
    options = {"num_warps": _FUSED_WARPS}
    if not triton_interpreting():
        options["launch_cooperative_grid"] = True
    return bound, options


def _fused_programs(regime, bound: dict, device) -> int:
    """As many programs as the SMs hold at once (known once the kernel is compiled: registers
    bound it; two per SM until then, which always fit), so the scatter has enough loads and
    atomics in flight. A cooperative launch fails rather than hangs if they would not fit."""
    levels = bound["LK"] // bound["K"]
    work = max(
        triton.cdiv(bound["B"], bound["SCATTER_B"]) * levels,
        triton.cdiv(bound["LK"], bound["BLOCK_K"]),
    )
    per_sm = _RESIDENT_PER_SM.get(regime, 2)
    return min(work, per_sm * device_facts(device).sm_count)


_FUSED_WARPS = 4
_RESIDENT_PER_SM: dict[tuple, int] = {}


def _resident_programs(compiled, num_warps: int) -> int:
    """Programs of ``compiled`` one SM holds at once (registers, threads, shared memory), capped
    at 8 and at least 1; Hopper-class limits (64K registers, 2048 threads, 32 blocks per SM)."""
    threads = 32 * num_warps
    # Registers are granted per warp in blocks of 256 (per thread in steps of 8).
    regs = max(int(getattr(compiled, "n_regs", 0) or 0), 1)
    per_warp = -(-(-(-regs // 8) * 8 * 32) // 256) * 256
    by_regs = 65536 // (per_warp * num_warps)
    shared = int(getattr(compiled.metadata, "shared", 0) or 0)
    by_shared = (227 * 1024) // shared if shared else 32
    return max(1, min(8, by_regs, 2048 // threads, by_shared))


def triton_interpreting() -> bool:
    from triton_dispatch import interpreter_enabled

    return interpreter_enabled()


#: The small-batch kernel runs while B·K is at most this and D at most
#: :data:`SMALL_UPDATE_MAX_DIM`; above it the cooperative scatter + epilogue kernel. Launched from
#: a plan, the cooperative call's GPU work is nearly flat, 7.7–13 µs from (640, 256, 64) to
#: (16384, 256, 64) (kernel, zero-fill, candidate draw). The small-batch kernel reads every code of
#: the batch in every program, so its call grows with B·K: 15 µs at 640 × 256, 58 µs at
#: 4096 × 1024. It is ahead only at the smallest sizes: 5.4 against 7.1 µs at 64 × 16, level at
#: 256 × 64, and one launch fewer. H100 figures from ``tools/gpu/ema_crossover.py`` (BENCHMARKS.md,
#: "The cooperative kernel from the plan").
SMALL_UPDATE_MAX_WORK = 1 << 14
SMALL_UPDATE_MAX_DIM = 256


def small_update_fits(batch: int, num_codes: int, dim: int) -> bool:
    return batch * num_codes <= SMALL_UPDATE_MAX_WORK and dim <= SMALL_UPDATE_MAX_DIM


def small_update_launch(
    levels: int,
    batch: int,
    num_codes: int,
    dim: int,
    device: torch.device,
    decay: float,
    eps: float,
    threshold: float | None,
) -> KernelLaunch:
    """The bound launch of ``small_update_kernel``; per call it takes ``x, codes, codebook,
    cluster_size, embed_sum, counter, candidates, replaced`` (contiguous, any leading level dim)."""
    interpreting = triton_interpreting()
    block_d = padded_dim(dim)
    block_b = 16 if interpreting else min(256, max(16, 8192 // block_d))
    return KernelLaunch(
        small_update_kernel,
        (num_codes, levels),
        dict(
            B=batch,
            K=num_codes,
            D=dim,
            decay=float(decay),
            eps=float(eps),
            threshold=float(threshold) if threshold is not None else 0.0,
            HAS_THRESHOLD=threshold is not None,
            BLOCK_B=block_b,
            BLOCK_D=block_d,
        ),
        device=device,
        options={"num_warps": 4},
    )


def compile_update_ahead(
    x_dtype: torch.dtype,
    batch: int,
    codebook: torch.Tensor,
    cluster_size: torch.Tensor,
    embed_sum: torch.Tensor,
    steps_since_active: torch.Tensor,
    decay: float,
    eps: float,
    threshold: float | None,
) -> None:
    """Compile, on a background thread, the kernel of the active-only update that a training
    forward will run on ``batch`` rows per level of ``x_dtype`` (the state tensors as they are),
    while the search before it compiles (:mod:`triton_dispatch.compile_ahead`)."""
    levels, num_codes, dim = codebook.shape
    device = codebook.device
    state = (codebook, cluster_size, embed_sum, steps_since_active)
    if small_update_fits(batch, num_codes, dim):
        launch = small_update_launch(levels, batch, num_codes, dim, device, decay, eps, threshold)
        launch.compile_ahead(x_dtype, torch.int64, *state, torch.int64, torch.bool)
        return
    bound, options = _fused_bound(levels, batch, num_codes, dim, decay, eps, threshold)
    launch = KernelLaunch(fused_update_kernel, (1,), bound, device=device, options=options)
    launch.compile_ahead(
        x_dtype, torch.int64, torch.float32, *state, torch.int64, torch.bool
    )  # fmt: skip
