"""MaxSim's declaration: from it ``triton_dispatch`` derives the custom ops
``late_interaction_kernels::maxsim`` and ``..._backward`` (fakes and autograd included, so
``torch.compile(fullgraph=True)`` and CUDA graphs run it without a break), the eager autograd
node, the plan cache, the reference route and the argument checks.

One declaration serves every layout of :mod:`..common.layout`: padded queries ``Q (Nq, Lq, d)``
against ``D (Nd, Ld, d)`` (all pairs) or ``D (Nq, K, Ld, d)`` (each query's own K documents), or
with ``layout=PAIRS`` query ``i`` against document ``i`` of ``D (B, Ld, d)``; packed tokens
``(total, d)`` with ``cu_seqlens_q``/``cu_seqlens_d`` and the longest query ``lq`` (``layout=VARLEN``:
pair ``b``; ``VARLEN_ALL_PAIRS``: every query against every document, ``ld`` the longest document).
The backward reads the argmax rows the forward saves when the call will be differentiated.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from triton_dispatch.declaration import OpDeclaration, SettingSpec, TensorSpec

from ..common.layout import ALL_PAIRS, PAIRS, VARLEN, VARLEN_ALL_PAIRS, num_pairs
from ..common.validation import FLOAT_DTYPES, check_mask, check_pair, check_tensor
from .reference import (
    compute_dtype,
    maxsim_pairs_reference,
    maxsim_reference,
    maxsim_varlen_reference,
)
from .routing import BACKWARD_METHODS, sizes
from .torch_path import ReferenceMaxSim


def needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def zero_scores(shape, Q: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    # stays attached to the graph (zero gradients) when the inputs require grad
    out = torch.zeros(shape, dtype=compute_dtype(Q.dtype), device=Q.device)
    if needs_grad(Q, D):
        out = out + (Q.sum() + D.sum()).to(out.dtype) * 0
    return out


def _degenerate(layout, nq, nd, lq, ld) -> bool:
    """Nothing to score: an empty padded batch, or zero-length queries or documents."""
    return layout < VARLEN and min(nq, nd, lq, ld) == 0


# The messages keep 0.4.5's key phrases ("needs Q to be", "[B, L, d]", "D.shape[0] ==
# Q.shape[0]"), which callers' error matching looks for.
_PAIRS_RANKS = "maxsim_pairs needs both Q and D to be [B, L, d]"
_PADDED_SHAPES = {
    ALL_PAIRS: ("(Nq, Lq, d)", (3, 4), "(Nd, Ld, d) or (Nq, K, Ld, d)"),
    PAIRS: (f"(B, Lq, d): {_PAIRS_RANKS}", 3, f"(B, Ld, d): {_PAIRS_RANKS}"),
}


def _check(call) -> None:
    """The checks of a padded call (the packed layouts' entry points check theirs)."""
    if call["layout"] >= VARLEN:
        return
    Q, D = call["Q"], call["D"]
    q_text, d_ranks, d_text = _PADDED_SHAPES[call["layout"]]
    if call["layout"] == ALL_PAIRS and isinstance(D, torch.Tensor) and D.dim() == 4:
        # a single query is taken with 3-D documents only: with candidate lists its Nq is unclear
        q_text += ": a 4-D D needs Q to be 3-D, one query per candidate list"
    check_tensor("Q", Q, 3, q_text)
    check_tensor("D", D, d_ranks, d_text)
    check_pair(Q, D)
    nq, lq = Q.shape[:2]
    if call["layout"] == PAIRS and D.shape[0] != nq:
        raise ValueError(
            f"Q and D must hold the same number of pairs B (maxsim_pairs needs Q.shape[0] == "
            f"D.shape[0]); got {nq} and {D.shape[0]}"
        )
    if D.dim() == 4 and D.shape[0] != nq:
        raise ValueError(
            f"a 4-D D must be (Nq, K, Ld, d) with Nq={nq} from Q (needs D.shape[0] == Q.shape[0]); "
            f"got shape {tuple(D.shape)}"
        )
    check_mask("q_mask", call["q_mask"], (nq, lq))
    check_mask("d_mask", call["d_mask"], tuple(D.shape[:-1]))
    if D.shape[-2] == 0 and call["save_argmax"]:
        raise ValueError(
            "documents have zero length (Ld=0) while gradients are required: MaxSim has no "
            "gradient there; drop empty documents or mask them with d_mask instead"
        )


def _reference(Q, D, q_mask, d_mask, cu_q, cu_d, *, layout, lq, ld, normalize, **_):
    """The scores in plain PyTorch (:mod:`.reference`), differentiable; zeros attached to the
    graph when there is nothing to score."""
    layout, nq, nd, lq, ld, shape = sizes(
        dict(Q=Q, D=D, cu_seqlens_q=cu_q, cu_seqlens_d=cu_d, layout=layout, lq=lq, ld=ld)
    )
    if _degenerate(layout, nq, nd, lq, ld):
        return zero_scores(shape, Q, D)
    # eager: the argmax-scatter backward; traced, the plain reference (its host-side loops and
    # no-grad blocks have no place in a graph)
    if layout != VARLEN_ALL_PAIRS and needs_grad(Q, D) and not torch.compiler.is_compiling():
        return ReferenceMaxSim.apply(
            Q, D, q_mask, d_mask, cu_q, cu_d, layout, nq, nd, lq, ld, normalize
        ).reshape(shape)
    if layout == VARLEN:
        return maxsim_varlen_reference(Q, D, cu_q, cu_d, normalize=normalize)
    if layout == VARLEN_ALL_PAIRS:
        from ..varlen.reference import maxsim_varlen_all_pairs_reference

        if normalize:
            Q, D = (F.normalize(x.to(compute_dtype(x.dtype)), dim=-1) for x in (Q, D))
        return maxsim_varlen_all_pairs_reference(Q, D, cu_q, cu_d)
    if layout == PAIRS:
        return maxsim_pairs_reference(Q, D, q_mask, d_mask, normalize=normalize)
    return maxsim_reference(Q, D, q_mask, d_mask, normalize=normalize)


def _plan(call):
    # float64 has no Triton dot worth having: the reference computes it exactly
    if call["Q"].dtype == torch.float64 or _degenerate(*sizes(call)[:5]):
        return None
    from .plan import MaxSimPlan

    return MaxSimPlan(call, forward=True)


def _backward_plan(named):
    from .plan import MaxSimPlan

    return MaxSimPlan(named, forward=False)


def _fake(Q, D, q_mask, d_mask, cu_q, cu_d, *, save_argmax, **settings):
    layout, nq, nd, lq, _, shape = sizes(
        dict(Q=Q, D=D, cu_seqlens_q=cu_q, cu_seqlens_d=cu_d, **settings)
    )
    rows = (num_pairs(layout, nq, nd), lq) if save_argmax else (0,)
    return Q.new_empty(shape, dtype=torch.float32), Q.new_empty(rows, dtype=torch.int32)


def _tokens(name: str, shape: str) -> TensorSpec:
    # shapes and strides are checked by _check (padded) or the packed entry points; a strided
    # tensor is copied per call, so plans key on contiguity, not strides
    return TensorSpec(name, FLOAT_DTYPES, shape, binds_strides=False,
                      dtypes_expected="float16, bfloat16, float32 or float64")  # fmt: skip


def _extra(name: str, dtypes, expected: str) -> TensorSpec:
    return TensorSpec(name, dtypes, "", optional=True, differentiable=False, binds_strides=False,
                      dtypes_expected=expected)  # fmt: skip


MAXSIM = OpDeclaration(
    "late_interaction_kernels::maxsim",
    inputs=[
        _tokens("Q", "(Nq, Lq, d)"),
        _tokens("D", "(Nd, Ld, d) or (Nq, K, Ld, d)"),
        _extra("q_mask", (torch.bool,), "a bool tensor (True = valid token)"),
        _extra("d_mask", (torch.bool,), "a bool tensor (True = valid token)"),
        _extra("cu_seqlens_q", (torch.int32, torch.int64), "int32 or int64"),
        _extra("cu_seqlens_d", (torch.int32, torch.int64), "int32 or int64"),
    ],
    settings=[
        SettingSpec("layout", int, ALL_PAIRS, choices=(ALL_PAIRS, PAIRS, VARLEN, VARLEN_ALL_PAIRS)),
        SettingSpec("lq", int, 0),  # the packed layouts' longest query
        SettingSpec("ld", int, 0),  # and longest document
        SettingSpec("normalize", bool, False),
        SettingSpec("backward", str, "auto", choices=BACKWARD_METHODS, type_error=ValueError),
        SettingSpec("save_argmax", bool, False),  # filled in: whether the call is differentiated
    ],
    grad_setting="save_argmax",
    check=_check,
    outputs=("scores", "argmax"),
    returns=("scores",),
    saved=("Q", "D", "argmax", "cu_seqlens_q", "cu_seqlens_d"),
    backward_needs=True,
    reference=_reference,
    plan=_plan,
    fake=_fake,
    backward_fake=lambda grad, Q, D, *_, **__: (Q.new_empty(Q.shape), D.new_empty(D.shape)),
    backward_plan=_backward_plan,
    node_name="PlannedMaxSim",
)
