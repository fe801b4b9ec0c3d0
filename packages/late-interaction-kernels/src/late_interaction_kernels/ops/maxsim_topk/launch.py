"""Launch plan of the fused top-k kernel: which calls it takes, its state and its grid."""

from __future__ import annotations

import torch

from triton_dispatch import interpreter_enabled, next_power_of_2, padded_dim

from ..common.precision import NORM_EPS, dot_settings
from .kernels import topk_kernel
from .running_topk import RING, STATE_WORDS

#: Largest ``k`` the running top-k keeps (beyond it: the chunked path).
MAX_K = 1024
#: Longest query held in registers whole (longer queries take the chunked path).
MAX_QUERY_TOKENS = 128
#: Widest embedding the kernel takes.
MAX_DIM = 256
#: Programs of one launch (one per document and query); candidates keep the document index in
#: 32 bits.
MAX_PROGRAMS = 2**31 - 1
#: Smallest sort of a merge (kept list and one window of offers); a window is the rest of it.
MIN_SORT = 512


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
        and 0 < D.shape[0] * Q.shape[0] <= MAX_PROGRAMS
        and k <= MAX_K
        and _mask_ok(q_mask, tuple(Q.shape[:2]))
        and _mask_ok(d_mask, tuple(D.shape[:2]))
        and all(m is None or m.device == Q.device for m in (q_mask, d_mask))
    )


def fused_topk(Q, D, k, q_mask, d_mask, normalize, largest):
    """``(scores, indices)``, each ``(Nq, k)``, best first, from one launch."""
    nq, lq, dim = Q.shape
    nd, ld, _ = D.shape
    k_pad = max(next_power_of_2(k), 16)
    sort = max(2 * k_pad, MIN_SORT)
    window = sort - k_pad
    list_words = k_pad + RING * window
    # the state starts at zero on every call; the lists need no clearing
    state = torch.zeros(nq, STATE_WORDS, dtype=torch.int64, device=Q.device)
    lists = torch.empty(nq, list_words, dtype=torch.int64, device=Q.device)
    scores = torch.empty(nq, k, dtype=torch.float32, device=Q.device)
    index = torch.empty(nq, k, dtype=torch.int64, device=Q.device)
    upcast, ieee = dot_settings(Q.dtype)
    block_k = max(padded_dim(dim), 16)
    Qc, Dc = Q.contiguous(), D.contiguous()
    qm = Qc if q_mask is None else q_mask.contiguous().view(torch.uint8)
    dm = Dc if d_mask is None else d_mask.contiguous().view(torch.uint8)
    topk_kernel[(nq * nd,)](
        Qc, Dc, qm, dm, state, lists, scores, index,
        nq, lq, ld, dim, nd, k,
        HAS_QM=q_mask is not None, HAS_DM=d_mask is not None, NORMALIZE=bool(normalize),
        LARGEST=bool(largest), UPCAST=upcast, IEEE=ieee, NORM_EPS=NORM_EPS,
        EVEN_K=block_k == dim, DYNAMIC_BOUNDS=not interpreter_enabled(),
        BLOCK_Q=max(padded_dim(lq), 16), BLOCK_K=block_k, K_PAD=k_pad, WINDOW=window, SORT=sort,
        STATE_WORDS=STATE_WORDS, LIST_WORDS=list_words,
    )  # fmt: skip
    return scores, index
