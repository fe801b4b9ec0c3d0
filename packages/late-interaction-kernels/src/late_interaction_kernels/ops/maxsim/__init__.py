"""MaxSim (late-interaction) scores: validation, backend dispatch and the public functions."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from triton_dispatch import common_device, select_backend, uses_triton
from triton_dispatch.launch import PlanCache
from triton_dispatch.launch import call_key as plan_key

from .layout import ALL_PAIRS, GROUPED, PAIRS, VARLEN
from .norm_check import NORM_CHECK
from .op import maxsim_forward
from .reference import compute_dtype

BACKWARD_METHODS = ("auto", "unified", "lowmem")

#: All-pairs batches with at least this many (query, document) pairs go to ``lowmem`` under
#: ``auto``; ``None``: never. Measured on an H100 (BENCHMARKS.md), ``unified`` beat ``lowmem``'s
#: CSR kernel on every in-batch square (128×128 and 256×256 pairs, Ld 300 and 1030) in time and in
#: memory: the documents of an in-batch step are few, so its fp32 gradient buffer is small, while
#: the CSR kernel's sort of the argmax rows grows with the number of pairs.
AUTO_LOWMEM_MIN_PAIRS: int | None = None

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def resolve_backward(
    backward: str | None, layout: int, n_query: int, n_doc: int, lq: int | None = None
) -> str:
    """The backward method a call will use: ``"unified"`` or ``"lowmem"``.

    ``None``/``"auto"`` picks ``lowmem`` wherever it runs its dense kernel, which writes
    ``grad_D`` once with neither a sort nor an fp32 buffer: the 4-D (query × its own K documents)
    layout, pairs, and all-pairs calls whose queries hold few tokens in all (a rerank with
    gradients; ``lq`` is the query length, ``None`` if unknown). In-batch all-pairs calls and
    varlen get ``unified`` (see :data:`AUTO_LOWMEM_MIN_PAIRS`).
    """
    from .backward_plan import uses_dense_kernel

    method = "auto" if backward is None else backward
    if not isinstance(method, str) or method not in BACKWARD_METHODS:
        raise ValueError(
            f"backward={backward!r} is not a backward method; expected None or one of "
            + ", ".join(map(repr, BACKWARD_METHODS))
        )
    if method != "auto":
        return method
    if layout in (GROUPED, PAIRS) or (lq is not None and uses_dense_kernel(layout, n_query, lq)):
        return "lowmem"
    if (
        layout == ALL_PAIRS
        and AUTO_LOWMEM_MIN_PAIRS is not None
        and n_query * n_doc >= AUTO_LOWMEM_MIN_PAIRS
    ):
        return "lowmem"
    return "unified"


def _check_tensor(name: str, t, rank: int | tuple[int, ...], layout_text: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {layout_text}, got {type(t).__name__}")
    ranks = (rank,) if isinstance(rank, int) else rank
    if t.dim() not in ranks:
        raise ValueError(f"{name} must be {layout_text}; got shape {tuple(t.shape)}")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype}")


def _check_pair(Q: torch.Tensor, D: torch.Tensor, qn: str = "Q", dn: str = "D") -> None:
    if Q.dtype != D.dtype:
        raise TypeError(f"{qn} and {dn} must share a dtype; got {Q.dtype} and {D.dtype}")
    if Q.shape[-1] != D.shape[-1]:
        raise ValueError(
            f"{qn} and {dn} must share the embedding size d; got {qn}.shape[-1]={Q.shape[-1]} "
            f"and {dn}.shape[-1]={D.shape[-1]}"
        )


def _check_mask(name: str, mask, shape: tuple[int, ...]) -> torch.Tensor | None:
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a bool tensor of shape {shape}, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor (True = valid token), got {mask.dtype}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(mask.shape)}")
    return mask.contiguous()


def _backend_for(tensors, names, backend: str | None) -> str:
    device = common_device(tensors, names=names)
    chosen = "triton" if uses_triton(select_backend(device=device, backend=backend)) else "torch"
    # float64 has no Triton dot worth having: the reference path computes it exactly
    return "torch" if tensors[0].dtype == torch.float64 else chosen


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _zeros(shape, Q: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    # stays attached to the graph (zero gradients) when the inputs require grad
    out = torch.zeros(shape, dtype=compute_dtype(Q.dtype), device=Q.device)
    if _needs_grad(Q, D):
        out = out + (Q.sum() + D.sum()).to(out.dtype) * 0
    return out


def _check_normalize(normalize) -> bool:
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {type(normalize).__name__}")
    return normalize


def _no_grad_through_empty_docs(ld: int, Q: torch.Tensor, D: torch.Tensor) -> None:
    if ld == 0 and _needs_grad(Q, D):
        raise ValueError(
            "documents have zero length (Ld=0) while gradients are required: MaxSim has no "
            "gradient there; drop empty documents or mask them with d_mask instead"
        )


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
        Q: queries ``(Nq, Lq, d)``.
        D: documents ``(Nd, Ld, d)`` — every query against every document, scores ``(Nq, Nd)`` —
            or ``(Nq, K, Ld, d)`` — each query against its own K documents, scores ``(Nq, K)``.
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
    if not normalize and NORM_CHECK.pending and not torch.compiler.is_compiling():
        key = call_key(Q, D, q_mask, d_mask, normalize, backward, backend)
        if key is not None:
            return _maxsim_checking_norms(key, Q, D, q_mask, d_mask, normalize, backward, backend)
    return maxsim_unchecked(
        Q, D, q_mask, d_mask, normalize=normalize, backward=backward, backend=backend
    )


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
    if not torch.compiler.is_compiling():
        key = call_key(Q, D, q_mask, d_mask, normalize, backward, backend)
        if key is not None:
            plan = _MAXSIM_PLANS.get(
                key, lambda: _maxsim_plan(Q, D, q_mask, d_mask, normalize, backward, backend)
            )
            return plan(Q, D, q_mask, d_mask)
    call = _resolve_maxsim(Q, D, q_mask, d_mask, normalize, backward, backend)
    return _run(call, Q, D, q_mask, d_mask)


def _maxsim_checking_norms(key, Q, D, q_mask, d_mask, normalize, backward, backend):
    """An eager :func:`maxsim` call while the query-norm check is pending: the plan as usual (its
    build validates the arguments first), then the check, told whether this call built the plan."""
    misses = _MAXSIM_PLANS.misses
    plan = _MAXSIM_PLANS.get(
        key, lambda: _maxsim_plan(Q, D, q_mask, d_mask, normalize, backward, backend)
    )
    NORM_CHECK(Q, D, building_plan=_MAXSIM_PLANS.misses != misses)
    return plan(Q, D, q_mask, d_mask)


_MAXSIM_PLANS: PlanCache = PlanCache("late_interaction_kernels.maxsim")
_PAIRS_PLANS: PlanCache = PlanCache("late_interaction_kernels.maxsim_pairs")


def call_key(Q, D, q_mask, d_mask, *flags) -> tuple | None:
    """The plan key of a padded-layout call, or ``None`` when an argument is not what a plan can
    describe (the call then takes the validating path, which raises the clear error)."""
    return plan_key((Q, D, q_mask, d_mask), *flags, torch.is_grad_enabled())


class _Call(NamedTuple):
    """A validated padded-layout call: what the kernels need besides the tensors."""

    layout: int
    n_query: int
    n_doc: int
    lq: int
    ld: int
    dim: int
    backend: str
    method: str
    normalize: bool
    out_shape: tuple[int, ...]


def _resolve_maxsim(Q, D, q_mask, d_mask, normalize, backward, backend) -> _Call:
    _check_tensor("Q", Q, 3, "(Nq, Lq, d)")
    _check_tensor("D", D, (3, 4), "(Nd, Ld, d) or (Nq, K, Ld, d)")
    _check_pair(Q, D)
    nq, lq, d = Q.shape
    if D.dim() == 4 and D.shape[0] != nq:
        raise ValueError(
            f"a 4-D D must be (Nq, K, Ld, d) with Nq={nq} from Q; got shape {tuple(D.shape)}"
        )
    layout = ALL_PAIRS if D.dim() == 3 else GROUPED
    n_doc = D.shape[0] if layout == ALL_PAIRS else D.shape[1]
    ld = D.shape[-2]
    _check_mask("q_mask", q_mask, (nq, lq))
    _check_mask("d_mask", d_mask, tuple(D.shape[:-1]))
    chosen = _backend_for([Q, D, q_mask, d_mask], ["Q", "D", "q_mask", "d_mask"], backend)
    method = resolve_backward(backward, layout, nq, n_doc, lq)
    normalize = _check_normalize(normalize)
    _no_grad_through_empty_docs(ld, Q, D)
    return _Call(layout, nq, n_doc, lq, ld, d, chosen, method, normalize, (nq, n_doc))


def _resolve_pairs(Q, D, q_mask, d_mask, normalize, backward, backend) -> _Call:
    _check_tensor("Q", Q, 3, "(B, Lq, d)")
    _check_tensor("D", D, 3, "(B, Ld, d)")
    _check_pair(Q, D)
    b, lq, d = Q.shape
    if D.shape[0] != b:
        raise ValueError(f"Q and D must hold the same number of pairs B; got {b} and {D.shape[0]}")
    ld = D.shape[1]
    _check_mask("q_mask", q_mask, (b, lq))
    _check_mask("d_mask", d_mask, (b, ld))
    chosen = _backend_for([Q, D, q_mask, d_mask], ["Q", "D", "q_mask", "d_mask"], backend)
    method = resolve_backward(backward, PAIRS, b, 1, lq)
    normalize = _check_normalize(normalize)
    _no_grad_through_empty_docs(ld, Q, D)
    return _Call(PAIRS, b, 1, lq, ld, d, chosen, method, normalize, (b,))


def _run(call: _Call, Q, D, q_mask, d_mask) -> torch.Tensor:
    """The validated call through :func:`maxsim_forward` (custom op under ``torch.compile``)."""
    layout, nq, n_doc, lq, ld, d, chosen, method, normalize, out_shape = call
    if nq == 0 or n_doc == 0 or lq == 0 or ld == 0:
        return _zeros(out_shape, Q, D)
    q_mask = None if q_mask is None else q_mask.contiguous()
    dm = None if d_mask is None else d_mask.contiguous().reshape(-1, ld)
    scores, _ = maxsim_forward(
        Q.reshape(nq * lq, d).contiguous(),
        D.reshape(-1, d).contiguous(),
        q_mask, dm, None, None,
        layout, nq, n_doc, lq, ld, _needs_grad(Q, D), chosen, method, normalize,
    )  # fmt: skip
    return scores.view(out_shape)


def _compiled_ahead(plan):
    plan.compile_ahead()  # its kernels compile beside the forward's
    return plan


def _plan(call: _Call, Q, D, q_mask, d_mask):
    """The eager plan of a validated call on the Triton backend: inference binds the forward plan
    directly (views of contiguous inputs, one output allocation, one launch), training binds the
    forward and backward plans into one autograd node (:class:`.op.PlannedMaxSim`). Other calls
    run :func:`_run`."""
    layout, nq, n_doc, lq, ld, d, chosen, method, normalize, out_shape = call
    degenerate = nq == 0 or n_doc == 0 or lq == 0 or ld == 0
    if degenerate or chosen != "triton":
        return lambda Q, D, q_mask, d_mask: _run(call, Q, D, q_mask, d_mask)
    from .forward import FORWARD_PLANS, ForwardPlan

    training = _needs_grad(Q, D)
    q_rows, d_rows = nq * lq, math.prod(D.shape[:-1])
    meta = (
        layout, nq, n_doc, lq, ld, d, Q.dtype, Q.device, q_mask is not None, d_mask is not None,
        training, normalize, q_rows, d_rows,
    )  # fmt: skip
    forward = FORWARD_PLANS.get(meta, lambda: ForwardPlan(*meta))
    if training:
        from .backward_plan import BACKWARD_PLANS, BackwardPlan
        from .op import PlannedMaxSim

        bmeta = (
            layout, nq, n_doc, lq, q_rows, d_rows, d, Q.dtype, Q.device, method,
            Q.requires_grad, D.requires_grad, normalize,
        )  # fmt: skip
        backward = BACKWARD_PLANS.get(bmeta, lambda: _compiled_ahead(BackwardPlan(*bmeta)))
        plans = (forward, backward, q_rows, d_rows, ld, out_shape)
        return lambda Q, D, q_mask, d_mask: PlannedMaxSim.apply(Q, D, q_mask, d_mask, plans)
    views = Q.is_contiguous() and D.is_contiguous()
    masks_contiguous = all(m is None or m.is_contiguous() for m in (q_mask, d_mask))
    if views and masks_contiguous and q_mask is None and d_mask is None:

        def run(Q, D, q_mask, d_mask):
            return forward(Q.view(q_rows, d), D.view(d_rows, d), None, None, None, None)[0].view(
                out_shape
            )

        return run

    def run_general(Q, D, q_mask, d_mask):
        q_mask = None if q_mask is None else q_mask.contiguous()
        dm = None if d_mask is None else d_mask.contiguous().view(-1, ld)
        Q2 = Q.reshape(q_rows, d).contiguous()
        D2 = D.reshape(d_rows, d).contiguous()
        return forward(Q2, D2, q_mask, dm, None, None)[0].view(out_shape)

    return run_general


def _maxsim_plan(Q, D, q_mask, d_mask, normalize, backward, backend):
    call = _resolve_maxsim(Q, D, q_mask, d_mask, normalize, backward, backend)
    return _plan(call, Q, D, q_mask, d_mask)


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
    if not torch.compiler.is_compiling():
        key = call_key(Q, D, q_mask, d_mask, normalize, backward, backend)
        if key is not None:
            plan = _PAIRS_PLANS.get(
                key,
                lambda: _plan(
                    _resolve_pairs(Q, D, q_mask, d_mask, normalize, backward, backend),
                    Q,
                    D,
                    q_mask,
                    d_mask,
                ),
            )
            return plan(Q, D, q_mask, d_mask)
    call = _resolve_pairs(Q, D, q_mask, d_mask, normalize, backward, backend)
    return _run(call, Q, D, q_mask, d_mask)


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
    _check_tensor("Q_packed", Q_packed, 2, "(total_q, d)")
    _check_tensor("D_packed", D_packed, 2, "(total_d, d)")
    _check_pair(Q_packed, D_packed, "Q_packed", "D_packed")
    _check_cu("cu_seqlens_q", cu_seqlens_q)
    _check_cu("cu_seqlens_d", cu_seqlens_d)
    if cu_seqlens_q.numel() != cu_seqlens_d.numel():
        raise ValueError(
            "cu_seqlens_q and cu_seqlens_d must have the same length B + 1; got "
            f"{cu_seqlens_q.numel()} and {cu_seqlens_d.numel()}"
        )
    tensors = [Q_packed, D_packed, cu_seqlens_q, cu_seqlens_d]
    chosen = _backend_for(
        tensors, ["Q_packed", "D_packed", "cu_seqlens_q", "cu_seqlens_d"], backend
    )
    b = cu_seqlens_q.numel() - 1
    method = resolve_backward(backward, VARLEN, b, 1)
    normalize = _check_normalize(normalize)
    if not torch.compiler.is_compiling():
        q_lens = _seqlens("cu_seqlens_q", cu_seqlens_q, Q_packed.shape[0])
        d_lens = _seqlens("cu_seqlens_d", cu_seqlens_d, D_packed.shape[0])
        if max_seqlen_q is None:
            max_seqlen_q = int(q_lens.max()) if b > 0 else 0
        if _needs_grad(Q_packed, D_packed) and b > 0 and bool((d_lens == 0).any()):
            raise ValueError(
                "cu_seqlens_d holds a zero-length document while gradients are required: MaxSim "
                "has no gradient there; drop empty documents"
            )
    elif max_seqlen_q is None:
        raise ValueError("maxsim_varlen under torch.compile needs max_seqlen_q")
    if b == 0 or max_seqlen_q == 0:
        return _zeros((b,), Q_packed, D_packed)
    ld = int(max_seqlen_d) if max_seqlen_d is not None else 0
    scores, _ = maxsim_forward(
        Q_packed.contiguous(),
        D_packed.contiguous(),
        None, None, cu_seqlens_q.contiguous(), cu_seqlens_d.contiguous(),
        VARLEN, b, 1, int(max_seqlen_q), ld, _needs_grad(Q_packed, D_packed), chosen, method,
        normalize,
    )  # fmt: skip
    return scores


__all__ = [
    "AUTO_LOWMEM_MIN_PAIRS",
    "BACKWARD_METHODS",
    "maxsim",
    "maxsim_pairs",
    "maxsim_unchecked",
    "maxsim_varlen",
    "resolve_backward",
]
