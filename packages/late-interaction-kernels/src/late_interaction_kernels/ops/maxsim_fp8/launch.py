"""The launches of the FP8 kernels: which documents take the TMA kernel, the grid and bound
arguments, and the validated call's launch."""

from __future__ import annotations

import torch
import triton

from triton_dispatch import device_facts

from ..common import tma
from ..common.buffers import output_buffer

#: Programs per SM the kernel's grid aims for; each takes a run of documents (H100: 8 to 32 per
#: SM measure the same, 2 and 4 are slower on batches of queries).
PROGRAMS_PER_SM = 8
#: Documents of at most this many 64-token tiles run as one flat (document, tile) loop (H100,
#: per-token scales: 1.34x faster at 300 tokens; at 1024 tokens the nested loop is 1.6x faster).
FLAT_MAX_TILES = 8
#: The TMA kernel's config (H100 sweep at 1 × 10,000 × 32 × 300: 64-token tiles, 4 warps and 3
#: stages were the fastest; 128-token tiles, 8 warps and 4 stages slower).
TMA_BLOCK_D = 64
TMA_OPTIONS = dict(num_warps=4, num_stages=3)
#: Programs per SM of the TMA kernel (same sweep: 4 per SM fastest, 8 and 16 about 2 % slower).
TMA_PROGRAMS_PER_SM = 4


def uses_tma(Q, D, sd) -> bool:
    """Whether the documents go through the TMA kernel: on Hopper, short documents (the flat loop)
    with one scale for all of ``D``, 16-byte rows, coordinates that fit in int32. (H100: at
    1 × 1000 × 128 × 1024 the pointer kernel measured faster, and with per-token document scales
    at 1 × 10,000 × 32 × 300 too: 0.184 against 0.205 ms.)"""
    from triton_dispatch import interpreter_enabled

    nd, ld, dim = D.shape
    tile = 16 if interpreter_enabled() else TMA_BLOCK_D
    return (
        triton.cdiv(ld, tile) <= FLAT_MAX_TILES
        and sd.dim() == 0
        and tma.rows_fit(dim, D.element_size(), nd * ld)
        and tma.tma_supported(D.device)
    )


def geometry(Q, D, sq, sd, q_mask, d_mask, use_tma=False) -> tuple[dict, tuple[int, int], int, int]:
    """The kernel's bound arguments, its grid, the query blocks and the output rows; ``use_tma``: for
    :func:`.kernels.fp8_maxsim_tma_kernel` (its tile fixed, its own programs per SM)."""
    from triton_dispatch import interpreter_enabled, next_power_of_2, padded_dim

    nq, lq, dim = Q.shape
    nd, ld, _ = D.shape
    interp = interpreter_enabled()
    # fp8 dots need K >= 32 on the tensor cores
    block_k = max(padded_dim(dim), 32)
    block_q = 16 if interp else min(max(padded_dim(lq), 16), 128)
    query_blocks = triton.cdiv(lq, block_q)
    # short queries share a program (up to 128 stacked token rows): the documents are read once
    # per group of queries, not once per query
    queries = 1 if query_blocks > 1 else min(next_power_of_2(nq), max(128 // block_q, 1))
    groups = triton.cdiv(nq, queries) * query_blocks
    if interp:
        runs = min(nd, 3)
    else:
        per_sm = TMA_PROGRAMS_PER_SM if use_tma else PROGRAMS_PER_SM
        target = per_sm * device_facts(Q.device).sm_count
        runs = max(1, min(nd, triton.cdiv(target, groups)))
    per_run = triton.cdiv(nd, runs)
    flat = triton.cdiv(ld, 64 if not interp else 16) <= FLAT_MAX_TILES
    bound = dict(
        nq=nq, nd=nd, lq=lq, ld=ld, dim=dim, docs_per_prog=per_run,
        Q_PER_TOKEN=sq.dim() > 0, D_PER_TOKEN=sd.dim() > 0, HAS_QM=q_mask is not None,
        HAS_DM=d_mask is not None, IEEE=Q.dtype == torch.float32, FLAT=flat, QUERIES=queries,
        BLOCK_Q=block_q, BLOCK_K=block_k,
    )  # fmt: skip
    if use_tma:
        bound["BLOCK_D"] = 16 if interp else TMA_BLOCK_D
    else:
        # short documents with per-token scales: (document tokens, query rows) tiles (H100,
        # 1 × 10,000 × 32 × 300: 0.150 against 0.175 ms); long documents keep (query rows,
        # document tokens), 0.070 against 0.075 ms at 1 × 1000 × 128 × 1024
        bound["TRANS"] = flat and sd.dim() > 0
    rows = nq * query_blocks
    return bound, (groups, triton.cdiv(nd, per_run)), query_blocks, rows


def tma_options() -> dict:
    from triton_dispatch import interpreter_enabled

    return {} if interpreter_enabled() else TMA_OPTIONS


def descriptor(D: torch.Tensor, bound: dict):
    return tma.rows_descriptor(D, bound["dim"], [bound["BLOCK_D"], bound["BLOCK_K"]])


def launch_maxsim_fp8(Q, D, sq, sd, q_mask, d_mask) -> torch.Tensor:
    from .kernels import fp8_maxsim_kernel, fp8_maxsim_tma_kernel

    nq, lq, _ = Q.shape
    nd, ld, _ = D.shape
    out = output_buffer((nq, nd), dtype=torch.float32, device=Q.device)
    if nq == 0 or nd == 0:
        return out
    if lq == 0 or ld == 0:
        return out.zero_()
    Qc, Dc = Q.contiguous(), D.contiguous()
    qm = Qc if q_mask is None else q_mask.contiguous().view(torch.uint8)
    dm = Dc if d_mask is None else d_mask.contiguous().view(torch.uint8)
    use_tma = uses_tma(Qc, Dc, sd) and tma.aligned(Dc)
    bound, grid, query_blocks, rows = geometry(Qc, Dc, sq, sd, q_mask, d_mask, use_tma)
    partial = out if query_blocks == 1 else torch.empty(rows, nd, device=Q.device)
    scales = (sq.contiguous(), sd.contiguous())
    if use_tma:
        desc = descriptor(Dc, bound)
        fp8_maxsim_tma_kernel[grid](
            Qc, Dc, desc, *scales, qm, dm, partial, **bound, **tma_options()
        )
    else:
        fp8_maxsim_kernel[grid](Qc, Dc, *scales, qm, dm, partial, **bound)
    return out if query_blocks == 1 else torch.sum(partial.view(nq, query_blocks, nd), 1, out=out)
