"""``maxsim_residual``'s Triton path as PyTorch custom ops (forward, and the query gradient), so
it runs inside ``torch.compile(fullgraph=True)``."""

from __future__ import annotations

import torch
import triton

from triton_dispatch import interpreter_enabled, padded_dim, shape_bucket

from ..common.buffers import output_buffer
from ..common.precision import dot_settings

#: Backward programs to aim for: documents are split across programs until there are this many.
TARGET_GRAD_PROGRAMS = 1024


@torch.library.custom_op("late_interaction_kernels::maxsim_residual_forward", mutates_args=())
def residual_forward_op(
    Q: torch.Tensor,
    q_mask: torch.Tensor | None,
    centroids: torch.Tensor,
    codes: torch.Tensor,
    packed: torch.Tensor,
    weights: torch.Tensor,
    offsets: torch.Tensor,
    nbits: int,
    save_argmax: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores ``(Nq, Nd)`` fp32 and, when ``save_argmax``, the winning token row of every
    (query, document, query token) ``(Nq, Nd, Lq)`` int64 (-1: none); else an empty tensor."""
    from .kernels import NORM_EPS, residual_fwd_kernel

    nq, lq, dim = Q.shape
    nd = offsets.shape[0] - 1
    best = output_buffer((nq, nd, lq), dtype=torch.float32, device=Q.device)
    shape = (nq, nd, lq) if save_argmax else (0,)
    argmax = output_buffer(shape, dtype=torch.int64, device=Q.device)
    if nq == 0 or nd == 0 or lq == 0:
        return best.new_zeros((nq, nd)), argmax.fill_(-1)
    upcast, ieee = dot_settings(Q.dtype)
    # only the interpreter's static loops read it (a host sync, as the op's body runs eagerly)
    max_len = int((offsets[1:] - offsets[:-1]).max()) if interpreter_enabled() else 0
    residual_fwd_kernel[(nd,)](
        Q, centroids, codes, packed, weights, offsets, best, argmax,
        nq * lq, nd, lq, dim, packed.shape[1], max(max_len, 1),
        shape_bucket(nq * lq, minimum=16, maximum=4096),
        NBITS=nbits, SAVE_ARGMAX=save_argmax, UPCAST=upcast, IEEE=ieee,
        DYNAMIC_BOUNDS=not interpreter_enabled(), NORM_EPS=NORM_EPS, BLOCK_K=padded_dim(dim),
    )  # fmt: skip
    # in place: the scratch is as large as the whole answer before the sum over query tokens
    dropped = best == float("-inf")
    if q_mask is not None:
        dropped |= ~q_mask[:, None, :]
    if save_argmax:
        argmax.masked_fill_(dropped, -1)
    return best.masked_fill_(dropped, 0.0).sum(-1), argmax


@residual_forward_op.register_fake
def _(Q, q_mask, centroids, codes, packed, weights, offsets, nbits, save_argmax):
    nq, lq, _ = Q.shape
    nd = offsets.shape[0] - 1
    scores = Q.new_empty((nq, nd), dtype=torch.float32)
    return scores, Q.new_empty((nq, nd, lq) if save_argmax else (0,), dtype=torch.int64)


@torch.library.custom_op("late_interaction_kernels::maxsim_residual_grad_q", mutates_args=())
def residual_grad_q_op(
    grad: torch.Tensor,
    argmax: torch.Tensor,
    centroids: torch.Tensor,
    codes: torch.Tensor,
    packed: torch.Tensor,
    weights: torch.Tensor,
    q_shape: list[int],
    q_dtype: torch.dtype,
    nbits: int,
) -> torch.Tensor:
    """``grad_Q[i, q] = sum_j grad[i, j] · token(argmax[i, j, q])``, in ``q_dtype``."""
    from .kernels import NORM_EPS, residual_grad_q_kernel

    nq, lq, dim = q_shape
    nd = argmax.shape[1]
    acc = torch.zeros((nq, lq, dim), dtype=torch.float32, device=argmax.device)
    if nq and lq and nd:
        per_query = triton.cdiv(lq, 16)
        splits = max(1, min(nd, TARGET_GRAD_PROGRAMS // max(nq * per_query, 1)))
        if interpreter_enabled():
            splits = min(nd, 2)
        per_split = triton.cdiv(nd, splits)
        splits = triton.cdiv(nd, per_split)
        grid = lambda meta: (nq, triton.cdiv(lq, meta["BLOCK_Q"]), splits)
        residual_grad_q_kernel[grid](
            grad.to(torch.float32).contiguous(), argmax, centroids, codes, packed, weights, acc,
            nd, lq, dim, packed.shape[1], per_split,
            NBITS=nbits, NORM_EPS=NORM_EPS, BLOCK_K=padded_dim(dim),
        )  # fmt: skip
    return acc if q_dtype == torch.float32 else acc.to(q_dtype)


@residual_grad_q_op.register_fake
def _(grad, argmax, centroids, codes, packed, weights, q_shape, q_dtype, nbits):
    return argmax.new_empty(tuple(q_shape), dtype=q_dtype)


def _setup_context(ctx, inputs, output):
    Q, _, centroids, codes, packed, weights, _, nbits, save_argmax = inputs
    ctx.save_for_backward(output[1], centroids, codes, packed, weights)
    ctx.meta = (list(Q.shape), Q.dtype, nbits, save_argmax)


def _backward(ctx, grad_scores, _grad_argmax):
    argmax, centroids, codes, packed, weights = ctx.saved_tensors
    q_shape, q_dtype, nbits, save_argmax = ctx.meta
    if not save_argmax:
        raise RuntimeError(
            "maxsim_residual: the forward ran without saving argmax indices (grad mode was off or "
            "Q did not require grad), so it cannot be differentiated"
        )
    grad_q = residual_grad_q_op(
        grad_scores, argmax, centroids, codes, packed, weights, q_shape, q_dtype, nbits
    )
    return (grad_q,) + (None,) * 8


residual_forward_op.register_autograd(_backward, setup_context=_setup_context)
