"""The eager plans of padded MaxSim calls: their caches and keys, the validated call through the
custom op, and the plans that bind the forward and backward launches once per kind of call."""

from __future__ import annotations

import math

import torch

from triton_dispatch.launch import PlanCache, call_key

from .op import maxsim_forward
from .reference import compute_dtype
from .validation import Call, needs_grad, resolve_maxsim

MAXSIM_PLANS: PlanCache = PlanCache("late_interaction_kernels.maxsim")
PAIRS_PLANS: PlanCache = PlanCache("late_interaction_kernels.maxsim_pairs")


def padded_call_key(Q, D, q_mask, d_mask, *flags) -> tuple | None:
    """The plan key of a padded-layout call, or ``None`` when an argument is not what a plan can
    describe (the call then takes the validating path, which raises the clear error)."""
    return call_key((Q, D, q_mask, d_mask), *flags, torch.is_grad_enabled())


def zero_scores(shape, Q: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    # stays attached to the graph (zero gradients) when the inputs require grad
    out = torch.zeros(shape, dtype=compute_dtype(Q.dtype), device=Q.device)
    if needs_grad(Q, D):
        out = out + (Q.sum() + D.sum()).to(out.dtype) * 0
    return out


def run_call(call: Call, Q, D, q_mask, d_mask) -> torch.Tensor:
    """The validated call through :func:`maxsim_forward` (custom op under ``torch.compile``)."""
    layout, nq, n_doc, lq, ld, d, chosen, method, normalize, out_shape = call
    if nq == 0 or n_doc == 0 or lq == 0 or ld == 0:
        return zero_scores(out_shape, Q, D)
    q_mask = None if q_mask is None else q_mask.contiguous()
    dm = None if d_mask is None else d_mask.contiguous().reshape(-1, ld)
    scores, _ = maxsim_forward(
        Q.reshape(nq * lq, d).contiguous(),
        D.reshape(-1, d).contiguous(),
        q_mask, dm, None, None,
        layout, nq, n_doc, lq, ld, needs_grad(Q, D), chosen, method, normalize,
    )  # fmt: skip
    return scores.view(out_shape)


def _compiled_ahead(plan):
    plan.compile_ahead()  # its kernels compile beside the forward's
    return plan


def plan_call(call: Call, Q, D, q_mask, d_mask):
    """The eager plan of a validated call on the Triton backend: inference binds the forward plan
    directly (views of contiguous inputs, one output allocation, one launch), training binds the
    forward and backward plans into one autograd node (:class:`.op.PlannedMaxSim`). Other calls
    run :func:`run_call`."""
    layout, nq, n_doc, lq, ld, d, chosen, method, normalize, out_shape = call
    degenerate = nq == 0 or n_doc == 0 or lq == 0 or ld == 0
    if degenerate or chosen != "triton":
        return lambda Q, D, q_mask, d_mask: run_call(call, Q, D, q_mask, d_mask)
    from .forward import FORWARD_PLANS, ForwardPlan

    training = needs_grad(Q, D)
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


def maxsim_plan(Q, D, q_mask, d_mask, normalize, backward, backend):
    call = resolve_maxsim(Q, D, q_mask, d_mask, normalize, backward, backend)
    return plan_call(call, Q, D, q_mask, d_mask)
