"""``maxsim_from_hidden``'s declaration: from it ``triton_dispatch`` derives the custom ops
``late_interaction_kernels::maxsim_from_hidden`` and ``..._backward`` (fakes and autograd
included, so ``torch.compile(fullgraph=True)`` runs the fused path without a break), the eager
autograd node, the plan cache and the reference route (chunks of projected documents through
:func:`maxsim`). The forward saves the winning tokens only when the call is differentiated.

Forward: :mod:`.kernels` (the projected documents are never written). Backward, for ``Q``, ``H_d``,
``W`` and ``b``: per chunk of documents, the chunk's projection is recomputed (activation
checkpointing: memory is one chunk's ``(c, Ld, d)`` tokens, whatever ``Nd``), MaxSim's backward
kernels turn the saved argmax into ``grad_Q`` and the gradient w.r.t. the projected tokens, and
that goes back through the normalisation and the projection with two matmuls.
"""

from __future__ import annotations

import torch
import triton

from triton_dispatch import interpreter_enabled, padded_dim, shape_bucket
from triton_dispatch.declaration import OpDeclaration, SettingSpec, TensorSpec

from ..common.buffers import output_buffer
from ..common.layout import ALL_PAIRS
from ..common.normalize import normalize_backward
from ..common.precision import dot_settings
from ..common.validation import FLOAT_DTYPES
from .validation import validate

#: Documents projected per chunk when none is given.
DEFAULT_CHUNK_SIZE = 256
#: Document tokens a forward program projects at once (smaller under the interpreter, so the
#: tests cover documents of several tiles and several splits).
BLOCK_T = 64
INTERPRET_BLOCK_T = 16
#: Programs the forward aims for: a document's tiles are split over programs until there are as
#: many (an H100 has 132 SMs).
TARGET_PROGRAMS = 264


def _splits(n_doc: int, ld: int, block_t: int) -> tuple[int, int]:
    """``(n_splits, tiles_per_split)`` of a document's ``ceil(ld / block_t)`` tiles."""
    tiles = triton.cdiv(ld, block_t)
    wanted = max(1, min(tiles, triton.cdiv(TARGET_PROGRAMS, max(n_doc, 1))))
    if interpreter_enabled():
        wanted = min(tiles, 2)
    per_split = triton.cdiv(tiles, wanted)
    return triton.cdiv(tiles, per_split), per_split


def kernels_cover(Q: torch.Tensor, H_d: torch.Tensor) -> bool:
    """Whether the fused kernels take a call: float64 has no Triton dot worth having, and an
    empty call has nothing to launch."""
    return Q.dtype != torch.float64 and min(*Q.shape, *H_d.shape) > 0


class FromHiddenPlan:
    """The fused forward of one kind of call (scores ``(Nq, Nd)`` fp32 and, when saved, the
    winners) and its chunked backward; ``named``: the call's tensors and settings by name."""

    def __init__(self, named) -> None:
        Q, H = named["Q"], named["H_d"]
        self.normalize, self.chunk_size = named["normalize"], named["chunk_size"]
        self.save_argmax = named["save_argmax"]
        nq, lq = Q.shape[:2]
        nd, ld, hdim = H.shape
        self.block_t = INTERPRET_BLOCK_T if interpreter_enabled() else BLOCK_T
        self.n_splits, self.per_split = _splits(nd, ld, self.block_t)
        self.buckets = (
            shape_bucket(hdim, minimum=16, maximum=1024),
            shape_bucket(nq * lq, minimum=16, maximum=4096),
        )
        self.upcast, self.ieee = dot_settings(Q.dtype)

    def forward(self, Q, H, W, b, d_mask, q_mask):
        """Scores and, when saved, the document-local index of every query token's winner
        ``(Nq, Nd, Lq)`` int32 (-1: none); else an empty tensor."""
        from .kernels import NORM_EPS, from_hidden_fwd_kernel

        nq, lq, dim = Q.shape
        nd, ld, hdim = H.shape
        n_splits, save_argmax = self.n_splits, self.save_argmax
        best = output_buffer((nq, nd, n_splits, lq), dtype=torch.float32, device=Q.device)
        idx = output_buffer(
            (nq, nd, n_splits, lq) if save_argmax else (0,), dtype=torch.int32, device=Q.device
        )
        dummy = best  # never read when its HAS_* flag is off
        from_hidden_fwd_kernel[(nd, n_splits)](
            Q, H, W, b if b is not None else dummy,
            d_mask.view(torch.uint8) if d_mask is not None else dummy, best, idx,
            nq * lq, nd, lq, ld, hdim, dim, n_splits, self.per_split, *self.buckets,
            HAS_B=b is not None, HAS_DM=d_mask is not None, NORMALIZE=self.normalize,
            SAVE_ARGMAX=save_argmax, UPCAST=self.upcast, IEEE=self.ieee, NORM_EPS=NORM_EPS,
            BLOCK_T=self.block_t, BLOCK_K=padded_dim(dim),
        )  # fmt: skip
        if n_splits == 1:
            top = best[:, :, 0]
        else:
            top, which = best.max(dim=2)
        keep = top != float("-inf")
        if q_mask is not None:
            keep &= q_mask[:, None, :]
        scores = torch.where(keep, top, 0.0).sum(-1)
        if not save_argmax:
            return scores, idx
        winner = idx[:, :, 0] if n_splits == 1 else idx.gather(2, which[:, :, None])[:, :, 0]
        return scores, torch.where(keep, winner, -1)

    def backward(self, grad, Q, H, W, b, argmax):
        # a caller that set save_argmax=False by name has no winners to send gradients through
        if not self.save_argmax:
            raise RuntimeError(
                "maxsim_from_hidden: the forward ran without saving argmax indices "
                "(save_argmax=False), so it cannot be differentiated"
            )
        return from_hidden_backward(grad, argmax, Q, H, W, b, self.normalize, self.chunk_size)


def from_hidden_backward(grad, argmax, Q, H, W, b, normalize, chunk_size):
    """``(grad_Q, grad_H, grad_W, grad_b)`` (``grad_b`` ``None`` without a bias), recomputing
    the projection ``chunk_size`` documents at a time."""
    from ..maxsim.backward_plan import maxsim_backward_triton

    nq, lq, dim = Q.shape
    nd, ld, hdim = H.shape
    grad = grad.to(torch.float32)
    Q2 = Q.reshape(nq * lq, dim)
    gq = torch.zeros(Q2.shape, dtype=torch.float32, device=Q.device)
    gh = torch.empty_like(H)
    gw = torch.zeros(W.shape, dtype=torch.float32, device=W.device)
    gb = torch.zeros(dim, dtype=torch.float32, device=W.device)
    bias = b.to(torch.float32) if b is not None else None
    for j0 in range(0, nd, chunk_size):
        j1 = min(j0 + chunk_size, nd)
        c = j1 - j0
        h2 = H[j0:j1].reshape(c * ld, hdim)
        y = (h2 @ W).to(torch.float32)
        if bias is not None:
            y = y + bias
        p = torch.nn.functional.normalize(y, dim=-1) if normalize else y
        local = argmax[:, j0:j1]
        base = (torch.arange(c, device=argmax.device, dtype=torch.int32) * ld)[None, :, None]
        rows = torch.where(local >= 0, local + base, -1).reshape(nq * c, lq)
        g = grad[:, j0:j1].reshape(-1)
        gq_c, gp = maxsim_backward_triton(g, Q2, p, rows, None, ALL_PAIRS, nq, c, lq, "unified")
        gq += gq_c
        gy = normalize_backward(gp.to(torch.float32), y) if normalize else gp.to(torch.float32)
        gy_low = gy.to(H.dtype)
        gh[j0:j1] = (gy_low @ W.t()).reshape(c, ld, hdim)
        gw += (h2.t() @ gy_low).to(torch.float32)
        gb += gy.sum(0)
    gb_out = gb.to(b.dtype) if b is not None else None
    return gq.to(Q.dtype).reshape(Q.shape), gh, gw.to(W.dtype), gb_out


def _plan(call):
    return FromHiddenPlan(call) if kernels_cover(call["Q"], call["H_d"]) else None


def _reference(Q, H_d, W, b, d_mask, q_mask, *, normalize, chunk_size, **_):
    from .torch_path import score_in_chunks  # imports maxsim: only when it runs

    return score_in_chunks(Q, H_d, W, b, d_mask, q_mask, normalize, chunk_size, "torch")


def _fake(Q, H_d, W, b, d_mask, q_mask, *, save_argmax, **_):
    (nq, lq, _), nd = Q.shape, H_d.shape[0]
    winners = Q.new_empty((nq, nd, lq) if save_argmax else (0,), dtype=torch.int32)
    return Q.new_empty((nq, nd), dtype=torch.float32), winners


def _backward_fake(grad, Q, H_d, W, b, argmax, **_):
    # the backward op's schema returns a tensor for every gradient: an empty one without a bias
    gb = torch.empty_like(b) if b is not None else W.new_empty((0,))
    return torch.empty_like(Q), torch.empty_like(H_d), torch.empty_like(W), gb


def _check(call) -> None:
    validate(*(call[n] for n in ("Q", "H_d", "W", "b", "d_mask", "q_mask", "chunk_size")))


def _tensor(name: str, shape: str, **flags) -> TensorSpec:
    # the kernels index rows as contiguous; plans read shapes only, so they key on contiguity
    return TensorSpec(name, FLOAT_DTYPES, shape, contiguous=True, binds_strides=False, **flags)


def _mask(name: str, shape: str) -> TensorSpec:
    return TensorSpec(name, (torch.bool,), shape, contiguous=True, optional=True,
                      differentiable=False, binds_strides=False)  # fmt: skip


FROM_HIDDEN = OpDeclaration(
    "late_interaction_kernels::maxsim_from_hidden",
    inputs=[
        _tensor("Q", "(Nq, Lq, d)"),
        _tensor("H_d", "(Nd, Ld, h)"),
        _tensor("W", "(h, d)"),
        _tensor("b", "(d,)", optional=True),
        _mask("d_mask", "(Nd, Ld)"),
        _mask("q_mask", "(Nq, Lq)"),
    ],
    settings=[
        SettingSpec("normalize", bool, True),
        SettingSpec("chunk_size", int, DEFAULT_CHUNK_SIZE),  # the backward's and the reference's
        SettingSpec("save_argmax", bool, False),  # filled in: whether the call is differentiated
    ],
    grad_setting="save_argmax",
    check=_check,
    outputs=("scores", "argmax"),
    returns=("scores",),
    saved=("Q", "H_d", "W", "b", "argmax"),
    reference=_reference,
    plan=_plan,
    fake=_fake,
    backward_fake=_backward_fake,
    backward_plan=FromHiddenPlan,
)
