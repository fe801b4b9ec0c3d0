"""MaxSim's public functions over its declaration (:mod:`.op`): the padded layouts (all pairs,
per-query groups, pairs) and the packed pairs, and the one-time query-norm check."""

from __future__ import annotations

import torch

from ..common.layout import PAIRS, VARLEN
from ..common.validation import backend_for, check_pair, check_tensor
from .norm_check import NORM_CHECK
from .op import MAXSIM, needs_grad, zero_scores

#: The eager plans of every MaxSim call (hits and misses count calls).
MAXSIM_PLANS = MAXSIM._plans


def _traced_backend(Q, backend):
    """Under ``torch.compile``, float64 takes the reference (eager plans decline it)."""
    return "torch" if getattr(Q, "dtype", None) == torch.float64 else backend


def maxsim(
    Q: torch.Tensor,
    D: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    normalize: bool = False,
    backward: str | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Late-interaction (ColBERT) scores: for each query token the best document token, summed.

    Args:
        Q: queries ``(Nq, Lq, d)``, or one query ``(Lq, d)`` (its axis is dropped from the
            scores, and ``q_mask`` may be ``(Lq,)``).
        D: documents ``(Nd, Ld, d)`` — every query against every document, scores ``(Nq, Nd)`` —
            or one document ``(Ld, d)`` (its axis dropped; ``d_mask`` may be ``(Ld,)``; one
            query against one document scores a 0-dim tensor), or ``(Nq, K, Ld, d)`` — each
            query against its own K documents, scores ``(Nq, K)``.
        q_mask: bool ``(Nq, Lq)``, True = valid token; masked query tokens contribute 0.
        d_mask: bool ``(Nd, Ld)`` or ``(Nq, K, Ld)``; masked document tokens never win; a document
            without a valid token scores 0 and gets no gradient.
        normalize: L2-normalise every token first (cosine similarities).
        backward: ``None``/``"auto"``, ``"unified"`` (fp32 atomics, fastest on small batches) or
            ``"lowmem"`` (no atomics, no fp32 gradient buffer, bitwise reproducible).
        backend: force ``"triton"``, ``"interpret"`` or ``"torch"`` (default: by device).

    Returns:
        float32 scores (float64 for float64 inputs). Differentiable w.r.t. ``Q`` and ``D``.

    Eager calls resolve everything that depends only on the arguments' metadata once per kind of
    call (see :mod:`triton_dispatch.launch`); a repeat call binds the tensors and launches.

    Warns once per process (``UserWarning``) when ``normalize=False`` meets queries whose median
    token norm is outside ``[0.9, 1.1]``, as late-interaction-kernels 0.4.5 does; only the first
    eligible call is looked at, and ``LIK_SUPPRESS_NORM_WARN=1`` silences it. See
    :mod:`.norm_check` for which call that is and why a warm call never pays a host read for it.
    """
    one_query, one_doc = _single(Q, D)
    if one_query or one_doc:
        # one query (the usual inference call) or one document, as 0.4.5 takes them: scored as
        # a batch of one, whose axis the result drops
        Q, q_mask = _batch_of_one(Q, q_mask, one_query)
        D, d_mask = _batch_of_one(D, d_mask, one_doc)
        scores = maxsim(
            Q, D, q_mask, d_mask, normalize=normalize, backward=backward, backend=backend
        )
        return scores[0 if one_query else slice(None), 0 if one_doc else slice(None)]
    if torch.compiler.is_compiling():
        backend = _traced_backend(Q, backend)
    elif not normalize and NORM_CHECK.pending:
        return _maxsim_checking_norms(Q, D, q_mask, d_mask, normalize, backward, backend)
    method = "auto" if backward is None else backward
    return MAXSIM(Q, D, q_mask, d_mask, None, None, normalize=normalize, backward=method,
                  backend=backend)  # fmt: skip


def _single(Q, D) -> tuple[bool, bool]:
    """Whether ``Q`` is one query ``(Lq, d)`` and ``D`` one document ``(Ld, d)``; with a 4-D
    ``D`` (candidate lists) a 2-D ``Q`` is refused, as in 0.4.5."""
    q_2d = isinstance(Q, torch.Tensor) and Q.dim() == 2
    d_rank = D.dim() if isinstance(D, torch.Tensor) else 0
    return q_2d and d_rank != 4, d_rank == 2 and (not isinstance(Q, torch.Tensor) or Q.dim() <= 3)


def _batch_of_one(x: torch.Tensor, mask, single: bool):
    """``x (L, d)`` as ``(1, L, d)``; its mask may be ``(L,)`` (as 0.4.5 takes it) or ``(1, L)``."""
    if not single:
        return x, mask
    if isinstance(mask, torch.Tensor) and mask.dim() == 1:
        mask = mask.unsqueeze(0)
    return x.unsqueeze(0), mask


def maxsim_unchecked(
    Q: torch.Tensor,
    D: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    normalize: bool = False,
    backward: str | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """:func:`maxsim` without the query-norm warning, for this package's own callers: the ops
    built on MaxSim that 0.4.5 did not check (top-k, PLAID, varlen, ...) and the warm-up, whose
    random queries say nothing about the caller's."""
    if torch.compiler.is_compiling():
        backend = _traced_backend(Q, backend)
    method = "auto" if backward is None else backward
    return MAXSIM(Q, D, q_mask, d_mask, None, None, normalize=normalize, backward=method,
                  backend=backend)  # fmt: skip


def _maxsim_checking_norms(Q, D, q_mask, d_mask, normalize, backward, backend):
    """An eager :func:`maxsim` call while the query-norm check is pending: the call as usual (its
    checks run first), then the check, told whether this call built its plan."""
    misses = MAXSIM_PLANS.misses
    scores = maxsim_unchecked(
        Q, D, q_mask, d_mask, normalize=normalize, backward=backward, backend=backend
    )
    NORM_CHECK(Q, D, building_plan=MAXSIM_PLANS.misses != misses)
    return scores


def maxsim_pairs(
    Q: torch.Tensor,
    D: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    normalize: bool = False,
    backward: str | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Query ``i`` against document ``i``: ``Q (B, Lq, d)``, ``D (B, Ld, d)`` → scores ``(B,)``.

    Masks ``q_mask (B, Lq)`` and ``d_mask (B, Ld)``; other arguments as in :func:`maxsim`.
    """
    if torch.compiler.is_compiling():
        backend = _traced_backend(Q, backend)
    method = "auto" if backward is None else backward
    return MAXSIM(Q, D, q_mask, d_mask, None, None, layout=PAIRS, normalize=normalize,
                  backward=method, backend=backend)  # fmt: skip


def maxsim_varlen(
    Q_packed: torch.Tensor,
    D_packed: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_d: torch.Tensor,
    max_seqlen_q: int | None = None,
    max_seqlen_d: int | None = None,
    *,
    normalize: bool = False,
    backward: str | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Packed variable-length pairs, no padding: query ``b`` is
    ``Q_packed[cu_seqlens_q[b]:cu_seqlens_q[b+1]]`` (``Q_packed (total_q, d)``), document ``b`` is
    ``D_packed[cu_seqlens_d[b]:cu_seqlens_d[b+1]]``. Returns scores ``(B,)``.

    ``max_seqlen_q`` (the longest query) is read from ``cu_seqlens_q`` when not given, which
    synchronises with the device; pass it in training loops. ``max_seqlen_d`` is accepted for
    symmetry with flash-attention style APIs. The offsets are validated (a host synchronisation)
    outside ``torch.compile``; a zero-length document raises when gradients are required.
    """
    check_tensor("Q_packed", Q_packed, 2, "(total_q, d)")
    check_tensor("D_packed", D_packed, 2, "(total_d, d)")
    check_pair(Q_packed, D_packed, "Q_packed", "D_packed")
    _check_cu("cu_seqlens_q", cu_seqlens_q)
    _check_cu("cu_seqlens_d", cu_seqlens_d)
    if cu_seqlens_q.numel() != cu_seqlens_d.numel():
        raise ValueError(
            "cu_seqlens_q and cu_seqlens_d must have the same length B + 1; got "
            f"{cu_seqlens_q.numel()} and {cu_seqlens_d.numel()}"
        )
    tensors = [Q_packed, D_packed, cu_seqlens_q, cu_seqlens_d]
    chosen = backend_for(tensors, ["Q_packed", "D_packed", "cu_seqlens_q", "cu_seqlens_d"], backend)
    b = cu_seqlens_q.numel() - 1
    if not torch.compiler.is_compiling():
        q_lens = _seqlens("cu_seqlens_q", cu_seqlens_q, Q_packed.shape[0])
        d_lens = _seqlens("cu_seqlens_d", cu_seqlens_d, D_packed.shape[0])
        if max_seqlen_q is None:
            max_seqlen_q = int(q_lens.max()) if b > 0 else 0
        if needs_grad(Q_packed, D_packed) and b > 0 and bool((d_lens == 0).any()):
            raise ValueError(
                "cu_seqlens_d holds a zero-length document while gradients are required: MaxSim "
                "has no gradient there; drop empty documents"
            )
    elif max_seqlen_q is None:
        raise ValueError("maxsim_varlen under torch.compile needs max_seqlen_q")
    if b == 0 or max_seqlen_q == 0:
        return zero_scores((b,), Q_packed, D_packed)
    return MAXSIM(
        Q_packed, D_packed, None, None, cu_seqlens_q.contiguous(), cu_seqlens_d.contiguous(),
        layout=VARLEN, lq=int(max_seqlen_q), ld=0 if max_seqlen_d is None else int(max_seqlen_d),
        normalize=normalize, backward="auto" if backward is None else backward,
        backend="torch" if chosen == "torch" else backend,
    )  # fmt: skip


def _check_cu(name: str, cu) -> None:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be an int32/int64 tensor of shape (B + 1,)")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must have shape (B + 1,), got {tuple(cu.shape)}")


def _seqlens(name: str, cu: torch.Tensor, rows: int) -> torch.Tensor:
    lengths = cu[1:] - cu[:-1]
    if cu.numel() > 1 and (bool((lengths < 0).any()) or int(cu[0]) < 0 or int(cu[-1]) > rows):
        raise ValueError(
            f"{name} must be non-decreasing offsets within the {rows} packed rows; got {cu.tolist()}"
        )
    return lengths
