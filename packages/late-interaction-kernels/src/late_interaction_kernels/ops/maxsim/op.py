"""MaxSim as PyTorch custom ops (forward and backward), so it runs inside
``torch.compile(fullgraph=True)`` and CUDA graphs without graph breaks.

Both ops work on the flattened problem of :mod:`..common.layout`; the public functions of
:mod:`.dispatch` build it. ``backend`` is ``"torch"`` (reference path) or ``"triton"`` (the kernels,
compiled or interpreted).
"""

from __future__ import annotations

import torch

from ..common.layout import num_pairs
from .reference import compute_dtype
from .torch_path import backward_torch, forward_torch

_EMPTY = (0,)


def _triton_forward(*args):
    from .forward import maxsim_forward_triton

    return maxsim_forward_triton(*args)


def _triton_backward(*args, **kwargs):
    from .backward_plan import maxsim_backward_triton

    return maxsim_backward_triton(*args, **kwargs)


@torch.library.custom_op("late_interaction_kernels::maxsim_forward", mutates_args=())
def maxsim_forward_op(
    Q2: torch.Tensor,
    D2: torch.Tensor,
    q_mask: torch.Tensor | None,
    d_mask: torch.Tensor | None,
    cu_q: torch.Tensor | None,
    cu_d: torch.Tensor | None,
    layout: int,
    n_query: int,
    n_doc: int,
    lq: int,
    ld: int,
    save_argmax: bool,
    backend: str,
    method: str,
    normalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores ``(pairs,)`` and the argmax rows ``(pairs, lq)`` (``(0,)`` when not saved).
    ``method`` is only read by the backward."""
    args = (
        Q2,
        D2,
        q_mask,
        d_mask,
        cu_q,
        cu_d,
        layout,
        n_query,
        n_doc,
        lq,
        ld,
        save_argmax,
        normalize,
    )
    scores, argmax = forward_torch(*args) if backend == "torch" else _triton_forward(*args)
    if not save_argmax:  # eager plans share one empty tensor; an op's outputs must be its own
        argmax = Q2.new_empty(_EMPTY, dtype=torch.int32)
    return scores, argmax


@maxsim_forward_op.register_fake
def _(
    Q2, D2, q_mask, d_mask, cu_q, cu_d, layout, n_query, n_doc, lq, ld, save_argmax, backend, method,
    normalize,
):  # fmt: skip
    n_pairs = num_pairs(layout, n_query, n_doc)
    dtype = compute_dtype(Q2.dtype) if backend == "torch" else torch.float32
    scores = Q2.new_empty((n_pairs,), dtype=dtype)
    shape = (n_pairs, lq) if save_argmax else _EMPTY
    return scores, Q2.new_empty(shape, dtype=torch.int32)


@torch.library.custom_op("late_interaction_kernels::maxsim_backward", mutates_args=())
def maxsim_backward_op(
    grad: torch.Tensor,
    Q2: torch.Tensor,
    D2: torch.Tensor,
    argmax: torch.Tensor,
    cu_q: torch.Tensor | None,
    layout: int,
    n_query: int,
    n_doc: int,
    lq: int,
    backend: str,
    method: str,
    need_q: bool,
    need_d: bool,
    normalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_Q2, grad_D2)``; an unneeded gradient comes back as an empty ``(0,)`` tensor."""
    return _backward_impl(
        grad, Q2, D2, argmax, cu_q, layout, n_query, n_doc, lq, backend, method, need_q, need_d,
        normalize,
    )  # fmt: skip


def _backward_impl(
    grad, Q2, D2, argmax, cu_q, layout, n_query, n_doc, lq, backend, method, need_q, need_d,
    normalize,
):  # fmt: skip
    if backend == "torch":
        gq, gd = backward_torch(
            grad, Q2, D2, argmax, cu_q, layout, n_query, n_doc, lq, normalize=normalize
        )
    else:
        gq, gd = _triton_backward(
            grad, Q2, D2, argmax, cu_q, layout, n_query, n_doc, lq, method,
            need_q=need_q, need_d=need_d, normalize=normalize,
        )  # fmt: skip
    gq = gq if need_q else Q2.new_empty(_EMPTY)
    gd = gd if need_d else D2.new_empty(_EMPTY)
    return gq, gd


@maxsim_backward_op.register_fake
def _(
    grad, Q2, D2, argmax, cu_q, layout, n_query, n_doc, lq, backend, method, need_q, need_d,
    normalize,
):  # fmt: skip
    gq = torch.empty_like(Q2) if need_q else Q2.new_empty(_EMPTY)
    gd = torch.empty_like(D2) if need_d else D2.new_empty(_EMPTY)
    return gq, gd


def _setup_context(ctx, inputs, output):
    (Q2, D2, _, _, cu_q, _, layout, n_query, n_doc, lq, _, save_argmax, backend, method,
     normalize) = inputs  # fmt: skip
    ctx.save_for_backward(Q2, D2, output[1], cu_q)
    ctx.meta = (layout, n_query, n_doc, lq, save_argmax, backend, method, normalize)


def _backward(ctx, grad_scores, _grad_argmax):
    Q2, D2, argmax, cu_q = ctx.saved_tensors
    layout, n_query, n_doc, lq, save_argmax, backend, method, normalize = ctx.meta
    if not save_argmax:
        raise RuntimeError(
            "maxsim: the forward ran without saving argmax indices (grad mode was off or no input "
            "required grad), so it cannot be differentiated"
        )
    need_q, need_d = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    gq, gd = maxsim_backward_op(
        grad_scores, Q2, D2, argmax, cu_q, layout, n_query, n_doc, lq, backend, method,
        need_q, need_d, normalize,
    )  # fmt: skip
    return (gq if need_q else None, gd if need_d else None) + (None,) * 13


maxsim_forward_op.register_autograd(_backward, setup_context=_setup_context)


class _EagerMaxSim(torch.autograd.Function):
    """The same forward and backward as the registered ops, for eager calls: a custom op's
    dispatch (autograd wrapper, a dynamo-disabled kernel per op) costs hundreds of microseconds
    of host time per training step, more than the kernels of a typical in-batch step."""

    @staticmethod
    def forward(ctx, *args):
        (Q2, D2, _, _, cu_q, _, layout, n_query, n_doc, lq, _, save_argmax, backend, method,
         normalize) = args  # fmt: skip
        scores, argmax = _forward_impl(*args)
        ctx.mark_non_differentiable(argmax)
        ctx.save_for_backward(Q2, D2, argmax, cu_q)
        ctx.meta = (layout, n_query, n_doc, lq, save_argmax, backend, method, normalize)
        return scores, argmax

    @staticmethod
    def backward(ctx, grad_scores, _grad_argmax):
        Q2, D2, argmax, cu_q = ctx.saved_tensors
        layout, n_query, n_doc, lq, _, backend, method, normalize = ctx.meta
        need_q, need_d = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gq, gd = _backward_impl(
            grad_scores, Q2, D2, argmax, cu_q, layout, n_query, n_doc, lq, backend, method,
            need_q, need_d, normalize,
        )  # fmt: skip
        return (gq if need_q else None, gd if need_d else None) + (None,) * 13


class PlannedMaxSim(torch.autograd.Function):
    """An eager training call whose forward and backward launches are already planned
    (``plans = (forward plan, backward plan, q_rows, d_rows, ld, out_shape)``): one autograd node
    over the caller's own tensors, reshaped inside (no view nodes), the least host work a
    training step's scoring can cost."""

    @staticmethod
    def forward(ctx, Q, D, q_mask, d_mask, plans):
        forward, backward, q_rows, d_rows, ld, out_shape = plans
        Q2 = Q.reshape(q_rows, Q.shape[-1]).contiguous()
        D2 = D.reshape(d_rows, D.shape[-1]).contiguous()
        qm = None if q_mask is None else q_mask.contiguous()
        dm = None if d_mask is None else d_mask.contiguous().view(-1, ld)
        scores, argmax = forward(Q2, D2, qm, dm, None, None)
        ctx.save_for_backward(Q2, D2, argmax)
        ctx.backward_plan = backward
        ctx.shapes = (Q.shape, D.shape)
        return scores.view(out_shape)

    @staticmethod
    def backward(ctx, grad_scores):
        Q2, D2, argmax = ctx.saved_tensors
        gq, gd = ctx.backward_plan(grad_scores.reshape(-1), Q2, D2, argmax, None)
        q_shape, d_shape = ctx.shapes
        gq = gq.view(q_shape) if gq is not None and ctx.needs_input_grad[0] else None
        gd = gd.view(d_shape) if gd is not None and ctx.needs_input_grad[1] else None
        return gq, gd, None, None, None


def _forward_impl(*args) -> tuple[torch.Tensor, torch.Tensor]:
    backend, normalize = args[12], args[14]
    inputs = (*args[:12], normalize)
    return forward_torch(*inputs) if backend == "torch" else _triton_forward(*inputs)


def maxsim_forward(*args) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`maxsim_forward_op` under ``torch.compile``; the same computation without the
    custom-op machinery in eager mode (an autograd function when gradients are needed, a direct
    call for inference), whose dispatch costs as much as the kernels at small shapes."""
    if torch.compiler.is_compiling():
        return maxsim_forward_op(*args)
    if args[11]:  # save_argmax: gradients are needed
        return _EagerMaxSim.apply(*args)
    return _forward_impl(*args)
