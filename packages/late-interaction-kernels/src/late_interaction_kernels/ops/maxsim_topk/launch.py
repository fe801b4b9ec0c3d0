"""Launch plan of the fused top-k kernel: which calls it takes, its grid, and the merge pass."""

from __future__ import annotations

import torch
import triton

from triton_dispatch import device_facts, interpreter_enabled, next_power_of_2, padded_dim

from ..maxsim.buffers import output_buffer
from ..maxsim.forward import dot_settings
from .kernels import topk_kernel

#: Largest ``k`` the running top-k keeps in registers (beyond it: the chunked path).
MAX_K = 1024
#: Longest query held in registers whole (longer queries take the chunked path).
MAX_QUERY_TOKENS = 128
#: Widest embedding the kernel takes.
MAX_DIM = 256
#: Programs per SM to aim for over all queries (memory is bounded by this, not by Nd).
PROGRAMS_PER_SM = 4
NORM_EPS = 1e-12


def _mask_ok(mask, shape) -> bool:
    return mask is None or (
        isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and tuple(mask.shape) == shape
    )


def kernel_takes(Q, D, k, q_mask, d_mask) -> bool:
    """Whether the fused kernel serves this call (anything else, bad input included, takes the
    chunked path, whose validation names the problem)."""
    return (
        Q.dtype in (torch.float16, torch.bfloat16, torch.float32)
        and D.dtype == Q.dtype
        and Q.shape[-1] == D.shape[-1]
        and 0 < Q.shape[1] <= MAX_QUERY_TOKENS
        and 0 < Q.shape[-1] <= MAX_DIM
        and D.shape[1] > 0
        and k <= MAX_K
        and _mask_ok(q_mask, tuple(Q.shape[:2]))
        and _mask_ok(d_mask, tuple(D.shape[:2]))
        and all(m is None or m.device == Q.device for m in (q_mask, d_mask))
    )


#: Query-token rows one program stacks into its tile (queries that fit, whole).
ROWS_PER_PROGRAM = 128


def queries_per_program(nq: int, lq: int) -> int:
    """Queries scored together by one program: each document tile is then read once for all of
    them (a batch of 16 queries reads the collection 4 times, not 16)."""
    fit = max(ROWS_PER_PROGRAM // max(padded_dim(lq), 16), 1)
    return min(next_power_of_2(nq), fit)


def programs_per_query(groups: int, nd: int, device: torch.device) -> int:
    if interpreter_enabled():
        return min(nd, 3)
    target = PROGRAMS_PER_SM * device_facts(device).sm_count
    return max(1, min(nd, triton.cdiv(target, groups)))


def fused_topk(Q, D, k, q_mask, d_mask, normalize, largest, sorted_):
    nq, lq, dim = Q.shape
    nd, ld, _ = D.shape
    queries = queries_per_program(nq, lq)
    groups = triton.cdiv(nq, queries)
    progs = programs_per_query(groups, nd, Q.device)
    per_prog = triton.cdiv(nd, progs)
    progs = triton.cdiv(nd, per_prog)
    k_pad = max(next_power_of_2(k), 2)
    keys = output_buffer((nq, progs, k_pad), dtype=torch.float32, device=Q.device)
    idx = output_buffer((nq, progs, k_pad), dtype=torch.int64, device=Q.device)
    upcast, ieee = dot_settings(Q.dtype)
    Qc, Dc = Q.contiguous(), D.contiguous()
    qm = Qc if q_mask is None else q_mask.contiguous().view(torch.uint8)
    dm = Dc if d_mask is None else d_mask.contiguous().view(torch.uint8)
    topk_kernel[(groups, progs)](
        Qc, Dc, qm, dm, keys, idx,
        nq, lq, ld, dim, nd, per_prog,
        HAS_QM=q_mask is not None, HAS_DM=d_mask is not None, NORMALIZE=bool(normalize),
        LARGEST=bool(largest), UPCAST=upcast, IEEE=ieee, NORM_EPS=NORM_EPS,
        QUERIES=queries, BLOCK_Q=max(padded_dim(lq), 16), BLOCK_K=max(padded_dim(dim), 16),
        K_PAD=k_pad,
    )  # fmt: skip
    top, where = keys.view(nq, -1).topk(k, dim=1, sorted=sorted_)
    scores = top if largest else -top
    return scores, idx.view(nq, -1).gather(1, where)
