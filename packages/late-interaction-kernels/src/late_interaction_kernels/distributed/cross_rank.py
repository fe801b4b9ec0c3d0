"""Cross-rank in-batch negatives: every rank's queries scored against every rank's documents.

Contrastive training on several GPUs enlarges the pool of negatives by gathering the documents of
all ranks. :func:`maxsim_across_ranks` does this with the fused MaxSim kernels on
``torch.distributed`` collectives:

* forward: one tiny all-gather of the ranks' sizes (skipped with ``uniform=True``), then one
  all-gather of the documents into one buffer (padded to the largest ``Nd`` and ``Ld``, the
  padding masked) and one fused MaxSim call over all of them;
* backward: one MaxSim backward over the gathered documents, then one reduce-scatter (sum) of
  their gradient: each rank ends with the summed gradient of its own documents.

This is the gradient that ``torch.distributed.nn.all_gather`` (what sentence-transformers' and
PyLate's ``all_gather_with_gradients`` call) followed by scoring gives, without its list of
per-rank tensors, their concatenation and the copies its collectives make, so swapping one for the
other changes no loss and no gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from ..ops.common.validation import check_mask as _check_mask
from ..ops.common.validation import check_pair as _check_pair
from ..ops.common.validation import check_tensor as _check_tensor
from ..ops.maxsim import maxsim, maxsim_unchecked

__all__ = ["maxsim_across_ranks"]

_DTYPE_CODES = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.float64: 4}
_DTYPE_NAMES = {code: str(dtype) for dtype, code in _DTYPE_CODES.items()}

# what each rank tells the others before anything is gathered; collectives of different sizes
# would hang or corrupt memory, so a disagreement must be found here and raised on every rank
_FIELDS = ("error", "nq", "nd", "ld", "dim", "dtype", "d_mask", "node", "d_grad", "normalize")


class _Layout(NamedTuple):
    """The agreed sizes of one call, the same on every rank."""

    rank: int
    world: int
    nd: tuple[int, ...]  # documents per rank
    ld: tuple[int, ...]  # document length per rank
    nd_max: int
    ld_max: int
    gather_mask: bool  # some rank has a d_mask or the lengths differ
    d_grad: bool  # some rank needs document gradients: every rank joins the reduce-scatter

    @property
    def offset(self) -> int:
        return sum(self.nd[: self.rank])

    @property
    def even(self) -> bool:
        return all(n == self.nd_max for n in self.nd)


def maxsim_across_ranks(
    Q: torch.Tensor,
    D: torch.Tensor,
    q_mask: torch.Tensor | None = None,
    d_mask: torch.Tensor | None = None,
    *,
    group: dist.ProcessGroup | None = None,
    normalize: bool = True,
    backward: str | None = "auto",
    backend: str | None = None,
    return_offset: bool = False,
    uniform: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, int]:
    """This rank's queries against the documents of every rank of ``group``.

    A collective: every rank of ``group`` must call it with the same ``normalize`` and, when
    gradients flow, run the backward of the result (the backward holds a collective too).

    Args:
        Q: this rank's queries ``(Nq, Lq, d)``; ``Nq`` and ``Lq`` may differ between ranks (zero
            queries included).
        D: this rank's documents ``(Nd, Ld, d)``; ``Nd`` and ``Ld`` may differ between ranks.
            ``d`` and the dtype must be the same everywhere.
        q_mask: bool ``(Nq, Lq)``, True = valid token.
        d_mask: bool ``(Nd, Ld)``; masked document tokens never win.
        group: the process group (default: the world). Without an initialised process group, or
            with one rank, this is :func:`~late_interaction_kernels.maxsim` on the local batch.
        normalize, backward, backend: as in :func:`~late_interaction_kernels.maxsim`.
        return_offset: also return the column of this rank's first document.
        uniform: promise that every rank passes the same shapes (``Nd``, ``Ld``, ``d``), dtype,
            ``normalize``, ``d_mask`` presence and ``requires_grad``, as a fixed-size training
            batch does. The size exchange (one small collective and one host read per call) is
            skipped, so the call never waits for the GPU; a rank that breaks the promise makes the
            collectives wait or fail, and a bad argument raises on its rank only.

    Returns:
        float32 scores ``(Nq, Nd_total)`` (float64 for float64 inputs); column ``j`` is row ``j``
        of ``torch.cat`` of every rank's ``D`` in rank order, so the documents of this rank sit
        at columns ``offset .. offset + Nd``, and ``offset + i`` is the positive of query ``i``
        in the usual one-positive-per-query batch. With ``return_offset``: ``(scores, offset)``.
        The gradient of ``D`` is the sum over ranks of the gradients their losses send to it: the
        result of one process scoring the concatenated batch under the sum of the ranks' losses.

    Raises:
        ValueError, TypeError: bad arguments on any rank (raised on every rank, naming the one
            at fault, so that no rank is left waiting in a collective).
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        _validate(Q, D, q_mask, d_mask, normalize)  # the ranks' rules, with one rank too
        scores = maxsim(
            Q, D, q_mask, d_mask, normalize=normalize, backward=backward, backend=backend
        )
        return (scores, 0) if return_offset else scores
    grad = torch.is_grad_enabled()
    info, error = _local_info(Q, D, q_mask, d_mask, normalize, grad)
    if uniform:
        layout = _uniform_layout(info, error, group)
    else:
        layout = _agree(info, error, D if isinstance(D, torch.Tensor) else None, group)
    scores = _scores(Q, D, q_mask, d_mask, layout, group, normalize, backward, backend)
    return (scores, layout.offset) if return_offset else scores


def _validate(Q, D, q_mask, d_mask, normalize) -> None:
    """One rank's arguments: ``ValueError`` / ``TypeError`` naming the bad one."""
    _check_tensor("Q", Q, 3, "(Nq, Lq, d)")
    _check_tensor("D", D, 3, "(Nd, Ld, d)")
    _check_pair(Q, D)
    _check_mask("q_mask", q_mask, tuple(Q.shape[:2]))
    _check_mask("d_mask", d_mask, tuple(D.shape[:2]))
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {type(normalize).__name__}")
    if Q.device != D.device:
        raise ValueError(f"Q and D must be on one device; got {Q.device} and {D.device}")


def _local_info(Q, D, q_mask, d_mask, normalize, grad) -> tuple[list[int], str]:
    """This rank's entry of the size exchange, and its validation error (``""`` if none)."""
    info = dict.fromkeys(_FIELDS, 0)
    try:
        _validate(Q, D, q_mask, d_mask, normalize)
    except (TypeError, ValueError) as exc:
        info["error"] = 1
        return list(info.values()), f"{type(exc).__name__}: {exc}"
    info.update(
        nq=Q.shape[0],
        nd=D.shape[0],
        ld=D.shape[1],
        dim=D.shape[2],
        dtype=_DTYPE_CODES[D.dtype],
        d_mask=int(d_mask is not None),
        node=int(grad and (Q.requires_grad or D.requires_grad)),
        d_grad=int(grad and D.requires_grad),
        normalize=int(normalize),
    )
    return list(info.values()), ""


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


def _exchange(info: list[int], device: torch.device | None, group) -> list[list[int]]:
    """Every rank's ``info``, rank by rank: one small all-gather and one host read."""
    world = dist.get_world_size(group)
    if dist.get_backend(group) == "nccl":
        device = device if device is not None and device.type == "cuda" else None
        device = device or torch.device("cuda", torch.cuda.current_device())
        # on an idle side stream the exchange waits for the other ranks only, not for the work
        # queued on this rank's compute stream (the encoder's forward, say)
        with torch.cuda.stream(_side_stream(device)):
            mine = torch.tensor(info, dtype=torch.int64).to(device)
            out = torch.empty(world * len(info), dtype=torch.int64, device=device)
            dist.all_gather_into_tensor(out, mine, group=group)
            rows = out.view(world, len(info)).tolist()
    else:
        mine = torch.tensor(info, dtype=torch.int64)
        out = torch.empty(world * len(info), dtype=torch.int64)
        dist.all_gather_into_tensor(out, mine, group=group)
        rows = out.view(world, len(info)).tolist()
    return rows


def _agree(info: list[int], error: str, D: torch.Tensor | None, group) -> _Layout:
    """Exchange the sizes and check them; every rank raises the same error if one is bad."""
    rows = _exchange(info, None if D is None else D.device, group)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    fields = [dict(zip(_FIELDS, row, strict=True)) for row in rows]
    bad = [r for r, f in enumerate(fields) if f["error"]]
    if bad:
        if error:
            raise (TypeError if error.startswith("TypeError") else ValueError)(
                f"maxsim_across_ranks: {error.split(': ', 1)[1]}"
            )
        raise ValueError(
            f"maxsim_across_ranks: the arguments of rank(s) {bad} are invalid (see that rank's "
            "error)"
        )
    first = fields[0]
    for key, what in (("dim", "the embedding size d"), ("dtype", "the dtype")):
        if any(f[key] != first[key] for f in fields):
            found = [f[key] if key == "dim" else _DTYPE_NAMES[f[key]] for f in fields]
            raise ValueError(f"maxsim_across_ranks: {what} of D must be the same on every rank; "
                             f"got {found} (rank by rank)")  # fmt: skip
    if any(f["normalize"] != first["normalize"] for f in fields):
        raise ValueError(
            "maxsim_across_ranks: normalize must be the same on every rank; got "
            f"{[bool(f['normalize']) for f in fields]} (rank by rank)"
        )
    d_grad = any(f["d_grad"] for f in fields)
    if d_grad and not all(f["node"] for f in fields):
        # a rank without a backward would never join the reduce-scatter of the others
        raise ValueError(
            "maxsim_across_ranks: D requires grad on some ranks, but on rank(s) "
            f"{[r for r, f in enumerate(fields) if not f['node']]} neither Q nor D does (or grad "
            "mode is off); every rank must take part in the backward"
        )
    nd = tuple(f["nd"] for f in fields)
    ld = tuple(f["ld"] for f in fields)
    if d_grad and any(n > 0 and length == 0 for n, length in zip(nd, ld, strict=True)):
        raise ValueError(
            "maxsim_across_ranks: documents of zero length (Ld=0) while gradients are required "
            f"(Ld per rank: {list(ld)}); drop empty documents or mask them with d_mask"
        )
    gather_mask = any(f["d_mask"] for f in fields) or len(set(ld)) > 1
    return _Layout(rank, world, nd, ld, max(nd), max(ld), gather_mask, d_grad)


def _uniform_layout(info: list[int], error: str, group) -> _Layout:
    """The layout of a call whose shapes every rank promised to share: built from this rank's
    own sizes, with no exchange."""
    if error:
        raise (TypeError if error.startswith("TypeError") else ValueError)(
            f"maxsim_across_ranks: {error.split(': ', 1)[1]}"
        )
    mine = dict(zip(_FIELDS, info, strict=True))
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if mine["d_grad"] and mine["nd"] > 0 and mine["ld"] == 0:
        raise ValueError(
            "maxsim_across_ranks: documents of zero length (Ld=0) while gradients are required; "
            "drop empty documents or mask them with d_mask"
        )
    nd, ld = (mine["nd"],) * world, (mine["ld"],) * world
    return _Layout(rank, world, nd, ld, mine["nd"], mine["ld"], bool(mine["d_mask"]),
                   bool(mine["d_grad"]))  # fmt: skip


def _padded(x: torch.Tensor, shape: tuple[int, ...], fill) -> torch.Tensor:
    if tuple(x.shape) == shape:
        return x.contiguous()
    out = x.new_full(shape, fill)
    out[tuple(slice(0, n) for n in x.shape)] = x
    return out


def _scores(Q, D, q_mask, d_mask, layout: _Layout, group, normalize, backward, backend):
    """One all-gather of the (padded) documents, then one MaxSim call over all of them, in the
    caller's autograd graph: the step is short and launch-bound, so one scoring call and no
    nested backward beat two calls overlapping the collective."""
    nd_max, ld_max = layout.nd_max, layout.ld_max
    if layout.d_grad and torch.is_grad_enabled():
        gathered = _GatherDocuments.apply(D, Q, layout, group)
    else:
        gathered = _gather(D.detach(), layout, group)
    gathered_mask = None
    if layout.gather_mask:
        mask = d_mask if d_mask is not None else D.new_ones(D.shape[:2], dtype=torch.bool)
        mask = _padded(mask, (nd_max, ld_max), False)
        gathered_mask = mask.new_empty((layout.world * nd_max, ld_max))
        dist.all_gather_into_tensor(gathered_mask, mask, group=group)
    scores = maxsim_unchecked(
        Q, gathered, q_mask, gathered_mask, normalize=normalize, backward=backward,
        backend=backend,
    )  # fmt: skip
    if layout.even:
        return scores
    columns = [r * nd_max + i for r, n in enumerate(layout.nd) for i in range(n)]
    return scores[:, torch.tensor(columns, device=scores.device)]


def _gather(D: torch.Tensor, layout: _Layout, group) -> torch.Tensor:
    """Every rank's documents, padded to ``(Nd_max, Ld_max)``, in rank order."""
    send = _padded(D, (layout.nd_max, layout.ld_max, D.shape[-1]), 0)
    gathered = D.new_empty((layout.world * layout.nd_max, layout.ld_max, D.shape[-1]))
    dist.all_gather_into_tensor(gathered, send, group=group)
    return gathered


class _GatherDocuments(torch.autograd.Function):
    """The all-gather of the documents; its backward reduce-scatters (sums) the gathered
    documents' gradient, so each rank receives the gradient every rank's loss sends to its own
    documents. ``Q`` is an input only so that this backward runs, and every rank joins the
    reduce-scatter, whenever the queries' gradient is asked for, even on a rank whose documents
    need none."""

    @staticmethod
    def forward(ctx, D, Q, layout, group):
        ctx.layout, ctx.group = layout, group
        ctx.shape, ctx.dtype = tuple(D.shape), D.dtype
        return _gather(D, layout, group)

    @staticmethod
    def backward(ctx, grad):
        layout = ctx.layout
        nd, ld, dim = ctx.shape
        mine = grad.new_empty((layout.nd_max, layout.ld_max, dim))
        dist.reduce_scatter_tensor(mine, grad.contiguous(), group=ctx.group)
        grad_d = mine[:nd, :ld].to(ctx.dtype) if ctx.needs_input_grad[0] else None
        return grad_d, None, None, None
