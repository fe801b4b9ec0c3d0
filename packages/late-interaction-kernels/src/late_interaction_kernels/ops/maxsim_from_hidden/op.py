"""``maxsim_from_hidden``'s Triton path as PyTorch custom ops, so it runs inside
``torch.compile(fullgraph=True)``.

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

from ..common.buffers import output_buffer
from ..common.layout import ALL_PAIRS
from ..common.normalize import normalize_backward
from ..common.precision import dot_settings

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


@torch.library.custom_op("late_interaction_kernels::maxsim_from_hidden_forward", mutates_args=())
def from_hidden_forward_op(
    Q: torch.Tensor,
    H: torch.Tensor,
    W: torch.Tensor,
    b: torch.Tensor | None,
    d_mask: torch.Tensor | None,
    q_mask: torch.Tensor | None,
    normalize: bool,
    save_argmax: bool,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores ``(Nq, Nd)`` fp32 and, when ``save_argmax``, the document-local index of every
    query token's winner ``(Nq, Nd, Lq)`` int32 (-1: none); else an empty tensor.
    ``chunk_size`` is only read by the backward."""
    from .kernels import NORM_EPS, from_hidden_fwd_kernel

    nq, lq, dim = Q.shape
    nd, ld, hdim = H.shape
    block_t = INTERPRET_BLOCK_T if interpreter_enabled() else BLOCK_T
    n_splits, per_split = _splits(nd, ld, block_t)
    best = output_buffer((nq, nd, n_splits, lq), dtype=torch.float32, device=Q.device)
    idx = output_buffer(
        (nq, nd, n_splits, lq) if save_argmax else (0,), dtype=torch.int32, device=Q.device
    )
    upcast, ieee = dot_settings(Q.dtype)
    dummy = best  # never read when its HAS_* flag is off
    from_hidden_fwd_kernel[(nd, n_splits)](
        Q, H, W, b if b is not None else dummy,
        d_mask.view(torch.uint8) if d_mask is not None else dummy, best, idx,
        nq * lq, nd, lq, ld, hdim, dim, n_splits, per_split,
        shape_bucket(hdim, minimum=16, maximum=1024), shape_bucket(nq * lq, minimum=16, maximum=4096),
        HAS_B=b is not None, HAS_DM=d_mask is not None, NORMALIZE=normalize,
        SAVE_ARGMAX=save_argmax, UPCAST=upcast, IEEE=ieee, NORM_EPS=NORM_EPS,
        BLOCK_T=block_t, BLOCK_K=padded_dim(dim),
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


@from_hidden_forward_op.register_fake
def _(Q, H, W, b, d_mask, q_mask, normalize, save_argmax, chunk_size):
    nq, lq, _ = Q.shape
    nd = H.shape[0]
    scores = Q.new_empty((nq, nd), dtype=torch.float32)
    return scores, Q.new_empty((nq, nd, lq) if save_argmax else (0,), dtype=torch.int32)


@torch.library.custom_op("late_interaction_kernels::maxsim_from_hidden_backward", mutates_args=())
def from_hidden_backward_op(
    grad: torch.Tensor,
    argmax: torch.Tensor,
    Q: torch.Tensor,
    H: torch.Tensor,
    W: torch.Tensor,
    b: torch.Tensor | None,
    normalize: bool,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(grad_Q, grad_H, grad_W, grad_b)``; ``grad_b`` is empty without a bias."""
    return from_hidden_backward(grad, argmax, Q, H, W, b, normalize, chunk_size)


@from_hidden_backward_op.register_fake
def _(grad, argmax, Q, H, W, b, normalize, chunk_size):
    gb = torch.empty_like(b) if b is not None else W.new_empty((0,))
    return torch.empty_like(Q), torch.empty_like(H), torch.empty_like(W), gb


def from_hidden_backward(grad, argmax, Q, H, W, b, normalize, chunk_size):
    """See :func:`from_hidden_backward_op`."""
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
    gb_out = gb.to(b.dtype) if b is not None else W.new_empty((0,))
    return gq.to(Q.dtype).reshape(Q.shape), gh, gw.to(W.dtype), gb_out


def _setup_context(ctx, inputs, output):
    Q, H, W, b, _, _, normalize, save_argmax, chunk_size = inputs
    ctx.save_for_backward(Q, H, W, b, output[1])
    ctx.meta = (normalize, save_argmax, chunk_size)


def _backward(ctx, grad_scores, _grad_argmax):
    Q, H, W, b, argmax = ctx.saved_tensors
    normalize, save_argmax, chunk_size = ctx.meta
    if not save_argmax:
        raise RuntimeError(
            "maxsim_from_hidden: the forward ran without saving argmax indices (grad mode was off "
            "or no input required grad), so it cannot be differentiated"
        )
    gq, gh, gw, gb = from_hidden_backward_op(grad_scores, argmax, Q, H, W, b, normalize, chunk_size)
    return gq, gh, gw, (gb if b is not None else None), None, None, None, None, None


from_hidden_forward_op.register_autograd(_backward, setup_context=_setup_context)
