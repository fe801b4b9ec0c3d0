"""Reranking candidates given as padded tensors with lengths: :func:`maxsim_padded`, and
:func:`pack_padded`, which converts them to the packed layout of
:func:`late_interaction_kernels.score_pairs.score_pairs_packed`."""

# no ``from __future__ import annotations`` here: PackedBatch's fields keep the classes as their
# types (``dataclasses.fields``, ``inspect.signature``), as in the published 0.4.5
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from triton_dispatch import common_device

from .ops.maxsim import maxsim

__all__ = ["PackedBatch", "maxsim_padded", "pack_padded"]


@dataclass(frozen=True)
class PackedBatch:
    """What :func:`pack_padded` returns (all tensors on the inputs' device); unpacks like a tuple
    in field order: ``Q, cu_q, D, cu_d, pq, pd, max_lq, max_ld = pack_padded(...)``.

    The constructor is 0.4.5's: the eight fields below, in this order, positional or by name, all
    required, typed ``torch.Tensor`` / ``int`` (no checks: any values are kept as given); the
    instance is frozen.
    """

    Q_packed: torch.Tensor
    """``(sum(query_lengths), d)`` query tokens."""
    cu_seqlens_q: torch.Tensor
    """``(B + 1,)`` int32 query offsets."""
    D_packed: torch.Tensor
    """``(sum(doc_lengths), d)`` document tokens, candidates in row-major ``(b, c)`` order."""
    cu_seqlens_d: torch.Tensor
    """``(B * C + 1,)`` int32 document offsets."""
    pair_q_idx: torch.Tensor
    """``(B * C,)`` int32, ``pair_q_idx[b * C + c] = b``."""
    pair_d_idx: torch.Tensor
    """``(B * C,)`` int32, ``pair_d_idx[b * C + c] = b * C + c``."""
    max_seqlen_q: int
    """Longest query (a Python int, so the scorer needs no host synchronisation)."""
    max_seqlen_d: int
    """Longest document."""

    def __iter__(self) -> Iterator:
        yield from (
            self.Q_packed, self.cu_seqlens_q, self.D_packed, self.cu_seqlens_d,
            self.pair_q_idx, self.pair_d_idx, self.max_seqlen_q, self.max_seqlen_d,
        )  # fmt: skip


def _check(queries, documents, query_lengths, doc_lengths) -> tuple[int, int]:
    if not isinstance(queries, torch.Tensor) or queries.dim() != 3:
        raise ValueError(f"queries must be [B, Lq, d]; got {_shape(queries)}")
    if not isinstance(documents, torch.Tensor) or documents.dim() != 4:
        raise ValueError(f"documents must be [B, C, Ld, d]; got {_shape(documents)}")
    b, _, dim = queries.shape
    bd, c, _, dd = documents.shape
    if b != bd:
        raise ValueError(f"batch size mismatch: queries B={b}, documents B={bd}")
    if dim != dd:
        raise ValueError(f"embedding dim mismatch: queries d={dim}, documents d={dd}")
    if not isinstance(query_lengths, torch.Tensor) or tuple(query_lengths.shape) != (b,):
        raise ValueError(f"query_lengths must be [B={b}]; got {_shape(query_lengths)}")
    if not isinstance(doc_lengths, torch.Tensor) or tuple(doc_lengths.shape) != (b, c):
        raise ValueError(f"doc_lengths must be [B={b}, C={c}]; got {_shape(doc_lengths)}")
    for name, x in (("queries", queries), ("documents", documents)):
        if x.dtype not in _FLOATS:
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}")
    for name, x in (("query_lengths", query_lengths), ("doc_lengths", doc_lengths)):
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got {x.dtype}")
    names = ("queries", "documents", "query_lengths", "doc_lengths")
    common_device([queries, documents, query_lengths, doc_lengths], names=names)
    return b, c


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _shape(x) -> str:
    return f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def _length_masks(queries, documents, query_lengths, doc_lengths, validate: bool):
    device = queries.device
    qlen = query_lengths.to(device=device, dtype=torch.int64)
    dlen = doc_lengths.to(device=device, dtype=torch.int64)
    lq, ld = queries.shape[1], documents.shape[2]
    if qlen.numel():
        qmin, qmax = torch.stack([qlen.min(), qlen.max()]).tolist()
        dmin, dmax = torch.stack([dlen.min(), dlen.max()]).tolist() if dlen.numel() else (1, 0)
        # out-of-range lengths would read padding as tokens: always an error
        if qmax > lq or qmin < 0:
            raise ValueError(
                f"query_lengths must lie in [0, Lq={lq}] (the padded extent of queries); "
                f"got values in [{qmin}, {qmax}]"
            )
        if dmax > ld or dmin < 0:
            raise ValueError(
                f"doc_lengths must lie in [0, Ld={ld}] (the padded extent of documents); "
                f"got values in [{dmin}, {dmax}]"
            )
        if validate and qmin <= 0:
            raise ValueError("query_lengths must all be > 0")
        if validate and dmin <= 0:
            raise ValueError("doc_lengths must all be > 0")
    q_mask = torch.arange(lq, device=device) < qlen[:, None]
    d_mask = torch.arange(ld, device=device) < dlen[..., None]
    return qlen, dlen, q_mask, d_mask


def pack_padded(
    queries: torch.Tensor,
    documents: torch.Tensor,
    query_lengths: torch.Tensor,
    doc_lengths: torch.Tensor,
    *,
    validate: bool = False,
) -> PackedBatch:
    """Pack ``queries (B, Lq, d)`` and candidates ``documents (B, C, Ld, d)`` with their valid
    lengths ``query_lengths (B,)`` / ``doc_lengths (B, C)`` into a :class:`PackedBatch`.

    Lengths beyond the padded extent raise ``ValueError``; ``validate=True`` also rejects
    zero lengths. One host synchronisation reads the lengths' extremes.
    """
    b, c = _check(queries, documents, query_lengths, doc_lengths)
    dim = queries.shape[-1]
    qlen, dlen, q_mask, d_mask = _length_masks(
        queries, documents, query_lengths, doc_lengths, validate
    )
    device = queries.device
    cu_q = torch.zeros(b + 1, dtype=torch.int32, device=device)
    cu_q[1:] = qlen.cumsum(0)
    cu_d = torch.zeros(b * c + 1, dtype=torch.int32, device=device)
    cu_d[1:] = dlen.reshape(-1).cumsum(0)
    pairs = torch.arange(b * c, dtype=torch.int32, device=device)
    longest = (
        torch.stack([qlen.max(), dlen.max()]).tolist()
        if b and c
        else [int(qlen.max()) if b else 0, 0]
    )
    return PackedBatch(
        Q_packed=queries.reshape(-1, dim)[q_mask.reshape(-1)],
        cu_seqlens_q=cu_q,
        D_packed=documents.reshape(-1, dim)[d_mask.reshape(-1)],
        cu_seqlens_d=cu_d,
        pair_q_idx=torch.div(pairs, max(c, 1), rounding_mode="floor"),
        pair_d_idx=pairs,
        max_seqlen_q=int(longest[0]),
        max_seqlen_d=int(longest[1]),
    )


def maxsim_padded(
    queries: torch.Tensor,
    documents: torch.Tensor,
    query_lengths: torch.Tensor,
    doc_lengths: torch.Tensor,
    *,
    validate: bool = False,
    normalize: bool = False,
    backward: str | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Score ``C`` candidates per query from padded inputs: ``(B, C)`` float32.

    Query ``b`` is ``queries[b, :query_lengths[b]]``, its candidate ``c`` is
    ``documents[b, c, :doc_lengths[b, c]]``; an empty query or candidate scores 0. Runs the
    per-query 4-D layout of :func:`late_interaction_kernels.maxsim` with length masks (one fused
    launch, no packing copy); differentiable in ``queries`` and ``documents``.
    ``normalize``, ``backward``, ``backend`` as in ``maxsim``.
    """
    _check(queries, documents, query_lengths, doc_lengths)
    _, _, q_mask, d_mask = _length_masks(queries, documents, query_lengths, doc_lengths, validate)
    return maxsim(
        queries, documents, q_mask, d_mask, normalize=normalize, backward=backward, backend=backend
    )
