"""Packed scoring: all pairs through the MaxSim kernels on the packed tokens where they serve the
call, padded blocks through :func:`maxsim` / :func:`maxsim_pairs` otherwise."""

from __future__ import annotations

import torch

from ..common.layout import VARLEN_ALL_PAIRS
from ..common.packed import check_devices, check_offsets, loop_bound, pad
from ..common.validation import backend_for
from ..maxsim import maxsim_pairs, maxsim_unchecked
from ..maxsim.op import MAXSIM


def _check_packed(Q_packed, D_packed) -> None:
    for name, x in (("Q_packed", Q_packed), ("D_packed", D_packed)):
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name} must be 2-D [sum(L), d]; got {got}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}")
    if Q_packed.shape[1] != D_packed.shape[1]:
        raise ValueError(
            "Q_packed and D_packed must share the embedding dim; got "
            f"{Q_packed.shape[1]} and {D_packed.shape[1]}"
        )


def _padded(name, packed, cu, max_seqlen):
    lengths = check_offsets(f"cu_seqlens_{name}", cu, packed.shape[0])
    width = loop_bound(f"max_seqlen_{name}", max_seqlen, lengths)
    return pad(packed, cu, lengths, width)


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
    """MaxSim of every packed query against every packed document, ``(Nq, Nd)`` float32.

    Args:
        Q_packed: ``(sum(Lq_i), d)`` query tokens, concatenated.
        D_packed: ``(sum(Ld_j), d)`` document tokens, concatenated.
        cu_seqlens_q: ``(Nq + 1,)`` int32/int64 offsets into ``Q_packed``.
        cu_seqlens_d: ``(Nd + 1,)`` offsets into ``D_packed`` (``Nd`` independent of ``Nq``).
        max_seqlen_q, max_seqlen_d: the longest query / document; read from the offsets when
            omitted. A value below the real maximum raises ``ValueError``.
        normalize, backward, backend: as in :func:`late_interaction_kernels.maxsim`.

    Returns:
        float32 ``(Nq, Nd)``, differentiable in both packed tensors; an empty query or document
        scores 0.
    """
    _check_packed(Q_packed, D_packed)
    check_devices(
        Q_packed=Q_packed, D_packed=D_packed, cu_seqlens_q=cu_seqlens_q, cu_seqlens_d=cu_seqlens_d
    )
    q_lengths = check_offsets("cu_seqlens_q", cu_seqlens_q, Q_packed.shape[0])
    d_lengths = check_offsets("cu_seqlens_d", cu_seqlens_d, D_packed.shape[0])
    lq = loop_bound("max_seqlen_q", max_seqlen_q, q_lengths)
    ld = loop_bound("max_seqlen_d", max_seqlen_d, d_lengths)
    nq, nd = q_lengths.numel(), d_lengths.numel()
    # the backend by device ("torch" for float64, which the reference path computes exactly)
    chosen = backend_for([Q_packed, D_packed], ["Q_packed", "D_packed"], backend)
    packed_kernels = (
        chosen == "triton"
        and Q_packed.dtype == D_packed.dtype
        and min(nq, nd, lq, ld) > 0
        and isinstance(normalize, bool)
    )
    if packed_kernels:
        return MAXSIM(
            Q_packed, D_packed, None, None, cu_seqlens_q.contiguous(), cu_seqlens_d.contiguous(),
            layout=VARLEN_ALL_PAIRS, lq=lq, ld=ld, normalize=normalize,
            backward="auto" if backward is None else backward, backend=backend,
        )  # fmt: skip
    # the PyTorch and float64 paths, and degenerate batches: padded blocks through maxsim
    Q, q_mask = pad(Q_packed, cu_seqlens_q, q_lengths, lq)
    D, d_mask = pad(D_packed, cu_seqlens_d, d_lengths, ld)
    return maxsim_unchecked(
        Q, D, q_mask, d_mask, normalize=normalize, backward=backward, backend=backend
    )


def score_pairs_packed(
    Q_packed: torch.Tensor,
    D_packed: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_d: torch.Tensor,
    pair_q_idx: torch.Tensor,
    pair_d_idx: torch.Tensor,
    *,
    max_seqlen_q: int | None = None,
    max_seqlen_d: int | None = None,
    normalize: bool = False,
    backward: str | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """MaxSim of listed ``(query, document)`` pairs from packed batches, ``(num_pairs,)`` float32.

    ``scores[k]`` scores query ``pair_q_idx[k]`` against document ``pair_d_idx[k]``; the
    ``(Nq, Nd)`` matrix is never formed. Other arguments as in :func:`maxsim_varlen`.
    Differentiable in both packed tensors.
    """
    _check_packed(Q_packed, D_packed)
    for name, idx in (("pair_q_idx", pair_q_idx), ("pair_d_idx", pair_d_idx)):
        if not isinstance(idx, torch.Tensor) or idx.dim() != 1 or idx.is_floating_point():
            raise ValueError(f"{name} must be a 1-D integer tensor")
    if pair_q_idx.shape != pair_d_idx.shape:
        raise ValueError(
            "pair_q_idx / pair_d_idx must be matching 1-D tensors; got "
            f"{tuple(pair_q_idx.shape)} and {tuple(pair_d_idx.shape)}"
        )
    check_devices(
        Q_packed=Q_packed, D_packed=D_packed, cu_seqlens_q=cu_seqlens_q, cu_seqlens_d=cu_seqlens_d,
        pair_q_idx=pair_q_idx, pair_d_idx=pair_d_idx,
    )  # fmt: skip
    Q, q_mask = _padded("q", Q_packed, cu_seqlens_q, max_seqlen_q)
    D, d_mask = _padded("d", D_packed, cu_seqlens_d, max_seqlen_d)
    if pair_q_idx.numel():
        lo, hi, dlo, dhi = torch.stack(
            [pair_q_idx.min(), pair_q_idx.max(), pair_d_idx.min(), pair_d_idx.max()]
        ).tolist()
        for name, low, high, n, what in (
            ("pair_q_idx", lo, hi, Q.shape[0], "queries"),
            ("pair_d_idx", dlo, dhi, D.shape[0], "documents"),
        ):
            if low < 0 or high >= n:
                raise ValueError(
                    f"{name} must index the {n} {what} of the packed batch, i.e. lie in "
                    f"[0, {n}); got values in [{low}, {high}]"
                )
    qi, di = pair_q_idx.long().to(Q.device), pair_d_idx.long().to(Q.device)
    return maxsim_pairs(
        Q[qi], D[di], q_mask[qi], d_mask[di],
        normalize=normalize, backward=backward, backend=backend,
    )  # fmt: skip
