"""Triton kernels of the EMA codebook update.

Two phases, so that the work is batch-parallel at every size and a distributed caller can
all-reduce between them:

* statistics: either a batch-parallel scatter (each program takes a tile of rows and adds them to
  their codes with atomics), or, in deterministic mode, a per-code segment reduction over the rows
  sorted by code (no atomics, a fixed summation order, bitwise reproducible);
* epilogue: one program per block of codes does the EMA blend, the codebook refresh, the counter
  and the dead-code restart, reading each code's state once.

All state is fp32; ``x`` may be fp32, fp16 or bf16 and is upcast on load.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_dispatch import autotune, config_space, padded_dim, shape_bucket

# Rows × padded columns held by one scatter program: enough to hide latency, small enough for
# registers.
_SCATTER_TILE = 4096


@triton.jit
def _row_is_finite(tile):
    bad = (tile != tile) | (tl.abs(tile) == float("inf"))
    return tl.sum(bad.to(tl.int32), axis=1) == 0


@autotune(
    config_space({}, num_warps=[2, 4, 8]),
    key=["ROWS_BUCKET", "BLOCK_D", "BLOCK_B", "SINGLE_TILE"],
    reset_to_zero=["counts_ptr", "sums_ptr"],
)
@triton.jit(do_not_specialize=["ROWS_BUCKET"])
def scatter_statistics_kernel(
    x_ptr,
    codes_ptr,
    counts_ptr,
    sums_ptr,
    B,
    D,
    K,
    ROWS_BUCKET,
    SINGLE_TILE: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """x (L·B, D) contiguous, codes (L·B,) → counts (L·K,), sums (L·K, D) by atomic adds.

    A row holding a NaN/inf, or a code outside [0, K), is skipped. When D does not fit one tile the
    row is read twice: once to check it is finite, once to add it (the second read hits L2).
    """
    pid = tl.program_id(0)
    level = tl.program_id(1)
    rows = pid * BLOCK_B + tl.arange(0, BLOCK_B)
    row_mask = rows < B
    code = tl.load(codes_ptr + level * B + rows, mask=row_mask, other=-1).to(tl.int64)
    keep = row_mask & (code >= 0) & (code < K)
    x_rows = x_ptr + (level * B + rows).to(tl.int64)[:, None] * D
    target = level * K + code
    cols = tl.arange(0, BLOCK_D)
    if SINGLE_TILE:
        m = keep[:, None] & (cols[None, :] < D)
        tile = tl.load(x_rows + cols[None, :], mask=m, other=0.0).to(tl.float32)
        keep = keep & _row_is_finite(tile)
        tl.atomic_add(
            sums_ptr + target[:, None] * D + cols[None, :],
            tile,
            mask=keep[:, None] & (cols[None, :] < D),
            sem="relaxed",
        )
    else:
        for d0 in range(0, D, BLOCK_D):
            c = d0 + cols
            m = keep[:, None] & (c[None, :] < D)
            tile = tl.load(x_rows + c[None, :], mask=m, other=0.0).to(tl.float32)
            keep = keep & _row_is_finite(tile)
        for d0 in range(0, D, BLOCK_D):
            c = d0 + cols
            m = keep[:, None] & (c[None, :] < D)
            tile = tl.load(x_rows + c[None, :], mask=m, other=0.0).to(tl.float32)
            tl.atomic_add(sums_ptr + target[:, None] * D + c[None, :], tile, mask=m, sem="relaxed")
    tl.atomic_add(
        counts_ptr + target, tl.full([BLOCK_B], 1.0, tl.float32), mask=keep, sem="relaxed"
    )


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


@autotune(
    config_space({"BLOCK_K": [16, 32], "BLOCK_D": [64, 128]}, num_warps=[4]),
    key=["CODES_BUCKET", "D_PADDED"],
    interpret_config=triton.Config({"BLOCK_K": 16, "BLOCK_D": 16}, num_warps=4),
    restore_value=["codebook_ptr", "size_ptr", "sum_ptr", "counter_ptr"],
)
@triton.jit(do_not_specialize=["CODES_BUCKET", "D_PADDED"])
def ema_epilogue_kernel(
    codebook_ptr,
    size_ptr,
    sum_ptr,
    counter_ptr,
    counts_ptr,
    sums_ptr,
    total_ptr,
    src_ptr,
    cand_ptr,
    replaced_ptr,
    rows_per_level,
    LK,
    K,
    D,
    decay,
    eps,
    threshold,
    reset_size,
    DECAY_ALL: tl.constexpr,
    HAS_THRESHOLD: tl.constexpr,
    CODES_BUCKET,
    D_PADDED,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Per-code epilogue over all L·K codes; see ``reference.ema_apply_reference_`` for the math."""
    g = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    gm = g < LK
    count = tl.load(counts_ptr + g, mask=gm, other=0.0)
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
        denom = tl.maximum(new_size, eps)
        blend = active
    denom = tl.where(refresh, denom, 1.0)
    new_counter = tl.where(active, 0, counter + 1)

    cols = tl.arange(0, BLOCK_D)
    row = (g // K).to(tl.int64) * rows_per_level + tl.load(cand_ptr + g, mask=gm, other=0).to(
        tl.int64
    )
    if HAS_THRESHOLD:
        if DECAY_ALL:
            dead = gm & (new_size < threshold)
        else:
            dead = gm & (new_counter >= threshold)
        # A restart needs the whole replacement row finite; check it before writing anything.
        for d0 in range(0, D, BLOCK_D):
            c = d0 + cols
            m = dead[:, None] & (c[None, :] < D)
            r = tl.load(src_ptr + row[:, None] * D + c[None, :], mask=m, other=0.0).to(tl.float32)
            dead = dead & _row_is_finite(r)
        replaced = dead
    else:
        replaced = gm & (count != count)  # all False, typed like a mask

    g64 = g.to(tl.int64)
    for d0 in range(0, D, BLOCK_D):
        c = d0 + cols
        m = gm[:, None] & (c[None, :] < D)
        off = g64[:, None] * D + c[None, :]
        old_sum = tl.load(sum_ptr + off, mask=m, other=0.0)
        batch_sum = tl.load(sums_ptr + off, mask=m, other=0.0)
        new_sum = tl.where(blend[:, None], decay * old_sum + (1.0 - decay) * batch_sum, old_sum)
        old_code = tl.load(codebook_ptr + off, mask=m, other=0.0).to(tl.float32)
        new_code = tl.where(refresh[:, None], new_sum / denom[:, None], old_code)
        rm = m & replaced[:, None]
        r = tl.load(src_ptr + row[:, None] * D + c[None, :], mask=rm, other=0.0).to(tl.float32)
        new_code = tl.where(replaced[:, None], r, new_code)
        new_sum = tl.where(replaced[:, None], r * reset_size, new_sum)
        tl.store(sum_ptr + off, new_sum, mask=m)
        tl.store(codebook_ptr + off, new_code.to(codebook_ptr.dtype.element_ty), mask=m)

    tl.store(size_ptr + g, tl.where(replaced, reset_size, new_size), mask=gm)
    tl.store(
        counter_ptr + g,
        tl.where(replaced, 0, new_counter).to(counter_ptr.dtype.element_ty),
        mask=gm,
    )
    tl.store(replaced_ptr + g, replaced, mask=gm)


def scatter_statistics(x: torch.Tensor, codes: torch.Tensor, num_codes: int):
    """Counts (L, K) and sums (L, K, D) in fp32 with the atomic scatter kernel.

    x (L, B, D) contiguous, codes (L, B) contiguous, B ≥ 1.
    """
    levels, batch, dim = x.shape
    counts = torch.zeros(levels, num_codes, device=x.device, dtype=torch.float32)
    sums = torch.zeros(levels, num_codes, dim, device=x.device, dtype=torch.float32)
    block_d = min(padded_dim(dim), 1024)
    block_b = max(1, min(_SCATTER_TILE // block_d, 64))
    if triton_interpreting():
        block_b = min(block_b, 16)
    grid = (triton.cdiv(batch, block_b), levels)
    scatter_statistics_kernel[grid](
        x,
        codes,
        counts,
        sums,
        batch,
        dim,
        num_codes,
        ROWS_BUCKET=shape_bucket(batch, minimum=256, maximum=1 << 20),
        SINGLE_TILE=dim <= block_d,
        BLOCK_B=block_b,
        BLOCK_D=block_d,
    )
    return counts, sums


def segment_statistics(x: torch.Tensor, codes: torch.Tensor, num_codes: int):
    """Deterministic counts and sums: rows sorted by (level, code) with a stable sort, then one
    program per code reduces its rows in order. No atomics; bitwise reproducible."""
    levels, _batch, dim = x.shape
    keep = torch.isfinite(x).all(-1) & (codes >= 0) & (codes < num_codes)
    keys = codes.long() + torch.arange(levels, device=x.device)[:, None] * num_codes
    keys = torch.where(keep, keys, torch.full_like(keys, levels * num_codes)).reshape(-1)
    sorted_keys, order = torch.sort(keys, stable=True)
    bounds = torch.arange(levels * num_codes + 1, device=x.device, dtype=sorted_keys.dtype)
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
    grid = lambda meta: (triton.cdiv(levels * num_codes, meta["BLOCK_K"]),)
    ema_epilogue_kernel[grid](
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
        CODES_BUCKET=shape_bucket(levels * num_codes, minimum=64, maximum=1 << 16),
        D_PADDED=padded_dim(dim),
    )
    return replaced


def triton_interpreting() -> bool:
    from triton_dispatch import interpreter_enabled

    return interpreter_enabled()
