"""``maxsim_residual``'s declaration: from it ``triton_dispatch`` derives the custom ops
``late_interaction_kernels::maxsim_residual`` and ``..._backward`` (fakes and autograd included,
so ``torch.compile(fullgraph=True)`` runs the fused path without a break), the eager autograd
node, the plan cache and the reference route (chunks of decompressed documents through
:func:`maxsim`). The forward saves the winning token rows only when the call is differentiated.
"""

from __future__ import annotations

import torch
import triton

from triton_dispatch import interpreter_enabled, padded_dim, shape_bucket
from triton_dispatch.declaration import OpDeclaration, SettingSpec, TensorSpec

from ..common.buffers import output_buffer
from ..common.precision import dot_settings
from ..common.validation import FLOAT_DTYPES

#: Backward programs to aim for: documents are split across programs until there are this many.
TARGET_GRAD_PROGRAMS = 1024
#: Documents decompressed per chunk when none is given.
DEFAULT_CHUNK_SIZE = 1024


class ResidualPlan:
    """The fused kernels of one kind of call: scores (and the winners, when saved) ``(Nq, Nd)``
    fp32, and the query gradient in ``Q``'s dtype."""

    def __init__(self, nbits: int, save_argmax: bool, q_shape, q_dtype) -> None:
        self.nbits, self.save_argmax = nbits, save_argmax
        self.q_shape, self.q_dtype = tuple(q_shape), q_dtype

    def forward(self, Q, q_mask, centroids, codes, packed, weights, doclens):
        """Scores ``(Nq, Nd)`` fp32 and, when saved, the winning token row of every (query,
        document, query token) ``(Nq, Nd, Lq)`` int64 (-1: none); else an empty tensor."""
        from .kernels import NORM_EPS, residual_fwd_kernel

        nbits, save_argmax = self.nbits, self.save_argmax
        offsets = torch.cat([doclens.new_zeros(1), doclens.cumsum(0)]).to(torch.int64)
        nq, lq, dim = Q.shape
        nd = offsets.shape[0] - 1
        best = output_buffer((nq, nd, lq), dtype=torch.float32, device=Q.device)
        shape = (nq, nd, lq) if save_argmax else (0,)
        argmax = output_buffer(shape, dtype=torch.int64, device=Q.device)
        if nq == 0 or nd == 0 or lq == 0:
            return best.new_zeros((nq, nd)), argmax.fill_(-1)
        upcast, ieee = dot_settings(Q.dtype)
        # only the interpreter's static loops read it (a host sync, as the op's body runs eagerly)
        max_len = int(doclens.max()) if interpreter_enabled() else 0
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

    def backward(self, grad, argmax, centroids, codes, packed, weights):
        """``grad_Q[i, q] = sum_j grad[i, j] · token(argmax[i, j, q])``, in ``Q``'s dtype."""
        from .kernels import NORM_EPS, residual_grad_q_kernel

        nbits, q_dtype = self.nbits, self.q_dtype
        nq, lq, dim = self.q_shape
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


def _plan(call):
    Q = call["Q"]
    if Q.dtype == torch.float64:  # the reference scores it exactly
        return None
    return ResidualPlan(call["nbits"], call["save_argmax"], Q.shape, Q.dtype)


def _reference(Q, q_mask, centroids, codes, packed, weights, doclens, *, nbits, chunk_size, **_):
    from .torch_path import decompress_and_score  # imports maxsim: only when it runs

    return decompress_and_score(
        Q, centroids, codes, packed, weights, doclens, nbits, q_mask, chunk_size, "torch"
    )


def _fake(Q, q_mask, centroids, codes, packed, weights, doclens, *, save_argmax, **_):
    (nq, lq, _), nd = Q.shape, doclens.shape[0]
    winners = Q.new_empty((nq, nd, lq) if save_argmax else (0,), dtype=torch.int64)
    return Q.new_empty((nq, nd), dtype=torch.float32), winners


def _input(name: str, dtypes) -> TensorSpec:
    # checked by the entry points (validation.py); passed contiguous, read per call
    return TensorSpec(name, dtypes, "", differentiable=False, binds_strides=False)


_INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)

RESIDUAL = OpDeclaration(
    "late_interaction_kernels::maxsim_residual",
    inputs=[
        TensorSpec("Q", FLOAT_DTYPES, "(Nq, Lq, d)", binds_strides=False),
        TensorSpec(
            "q_mask",
            (torch.bool,),
            "(Nq, Lq)",
            optional=True,
            differentiable=False,
            binds_strides=False,
        ),
        _input("centroids", FLOAT_DTYPES),
        _input("codes", _INTS),
        _input("packed_residuals", (torch.uint8,)),
        _input("bucket_weights", FLOAT_DTYPES),
        _input("doclens", _INTS),
    ],
    settings=[
        SettingSpec("nbits", int, 2, choices=(1, 2, 4, 8)),
        SettingSpec("chunk_size", int, DEFAULT_CHUNK_SIZE),  # the reference's
        SettingSpec("save_argmax", bool, False),  # filled in: whether the call is differentiated
    ],
    grad_setting="save_argmax",
    outputs=("scores", "argmax"),
    returns=("scores",),
    saved=("argmax", "centroids", "codes", "packed_residuals", "bucket_weights"),
    saved_meta=("Q",),
    reference=_reference,
    plan=_plan,
    fake=_fake,
    backward_fake=lambda grad, argmax, *_, Q_shape, Q_dtype, **__: (
        argmax.new_empty(Q_shape, dtype=Q_dtype),
    ),
    backward_plan=lambda named: ResidualPlan(
        named["nbits"], True, named["Q_shape"], named["Q_dtype"]
    ),
)


def residual_forward_op(Q, q_mask, centroids, codes, packed, weights, offsets, nbits, save_argmax):
    """The registered forward op over a collection given by its token offsets: ``(scores,
    winners)``."""
    doclens = offsets[1:] - offsets[:-1]
    return RESIDUAL.op(Q, q_mask, centroids, codes, packed, weights, doclens, nbits=nbits,
                       chunk_size=DEFAULT_CHUNK_SIZE, save_argmax=save_argmax)  # fmt: skip
