"""Exact MaxSim top-k search over a document collection split across the ranks of a
``torch.distributed`` process group (:class:`ShardedMaxSimIndex`).

Each rank holds one shard and scores it with the fused top-k (one launch for one or two queries on
CUDA, chunks of ``maxsim`` with a running top-k otherwise), so its memory is the shard plus a
workspace that does not grow with the collection. The ranks then exchange ``k`` candidates per
query in one ``all_gather`` and each merges them into the same global top-k. Ties are broken by
the smaller global document id, on every rank's shard and in the merge, so the result does not
depend on how the collection is split.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from triton_dispatch import select_backend, uses_triton

from ..ops.maxsim import maxsim_unchecked
from ..ops.maxsim_topk.op import CHUNK_SCORES, FUSED_MAX_QUERIES, MIN_CHUNK_SIZE, TOPK, fused_covers
from ..ops.retrieve import DEFAULT_CHUNK_SIZE, MaxSimIndex, pad_documents
from ..ops.retrieve.index import read_index_file
from ..ops.retrieve.validation import check_query_mask as _check_query_mask
from ..ops.retrieve.validation import describe as _describe
from .ranks import _NO_DOC, RankGroup

__all__ = ["ShardedMaxSimIndex"]

#: The on-disk layout of the per-rank files :meth:`ShardedMaxSimIndex.save` writes.
SHARD_FORMAT = 1
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_FILE = "shard-{:05d}-of-{:05d}.pt"
_FILE_RE = re.compile(r"shard-(\d{5})-of-(\d{5})\.pt$")


@dataclass
class _Block:
    """Documents added together: a padded ``(n, Ld, d)`` tensor (with its mask) or a list of
    ``(L_i, d)`` tensors. Blocks are never concatenated, so :meth:`ShardedMaxSimIndex.add` copies
    nothing already held."""

    start: int
    padded: torch.Tensor | None
    mask: torch.Tensor | None
    docs: list[torch.Tensor] | None

    def __len__(self) -> int:
        return self.padded.shape[0] if self.padded is not None else len(self.docs)

    def chunks(self, step: int):
        """Yield ``(first local index, D, d_mask)`` of ``step`` documents at a time."""
        for lo in range(0, len(self), step):
            hi = min(lo + step, len(self))
            if self.padded is not None:
                mask = None if self.mask is None else self.mask[lo:hi]
                yield self.start + lo, self.padded[lo:hi], mask
            else:
                yield self.start + lo, *pad_documents(self.docs[lo:hi])

    def state(self, chunk_size: int, normalize: bool) -> dict:
        if self.padded is not None:
            index = MaxSimIndex(self.padded, self.mask, chunk_size=chunk_size, normalize=normalize)
        else:
            index = MaxSimIndex(self.docs, chunk_size=chunk_size, normalize=normalize)
        return index._state()


def _make_block(documents, d_mask, where: str) -> _Block:
    """Validate one batch of documents (this rank's only: nothing here is collective)."""
    if isinstance(documents, torch.Tensor):
        if documents.dim() != 3:
            raise ValueError(
                f"{where} must be a (n, Ld, d) tensor or a list of (L, d) tensors, "
                f"got {_describe(documents)}"
            )
        if d_mask is not None and (
            not isinstance(d_mask, torch.Tensor)
            or d_mask.dtype != torch.bool
            or tuple(d_mask.shape) != tuple(documents.shape[:2])
            or d_mask.device != documents.device
        ):
            raise ValueError(
                f"d_mask must be a bool tensor of shape {tuple(documents.shape[:2])} on "
                f"{documents.device}, got {_describe(d_mask)}"
            )
        return _Block(0, documents, d_mask, None)
    if d_mask is not None:
        raise ValueError(
            "d_mask is only accepted with a (n, Ld, d) tensor; a list of documents is masked by "
            "its lengths"
        )
    if not isinstance(documents, Sequence):
        raise TypeError(
            f"{where} must be a (n, Ld, d) tensor or a list of (L, d) tensors, "
            f"got {_describe(documents)}"
        )
    docs = list(documents)
    for i, doc in enumerate(docs):
        if not isinstance(doc, torch.Tensor) or doc.dim() != 2:
            raise ValueError(f"{where}[{i}] must be an (L, d) tensor, got {_describe(doc)}")
        if doc.shape[-1] != docs[0].shape[-1] or doc.dtype != docs[0].dtype:
            raise ValueError(
                f"every document must share the width d and the dtype of {where}[0] "
                f"({docs[0].shape[-1]}, {docs[0].dtype}); {where}[{i}] is {_describe(doc)}"
            )
    return _Block(0, None, None, docs)


def _block_facts(block: _Block) -> tuple[int, torch.dtype | None, torch.device | None]:
    """``(d, dtype, device)`` of a block; ``(0, None, None)`` for an empty list."""
    if block.padded is not None:
        return block.padded.shape[-1], block.padded.dtype, block.padded.device
    if block.docs:
        return block.docs[0].shape[-1], block.docs[0].dtype, block.docs[0].device
    return 0, None, None


def _keys(scores: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """One int64 per candidate that orders candidates best first: the float32 score's bits made
    monotone in the high half, ``2**32 - 1 - order`` in the low half, so that between equal scores
    the smaller ``order`` (the smaller global id) wins, as in the fused kernel's running top-k.
    -0.0 and 0.0 are one key; NaN ranks first, as in :func:`torch.topk`."""
    bits = (scores + 0.0).view(torch.int32)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    ordered = torch.where(scores.isnan(), torch.iinfo(torch.int32).max, ordered)
    return ordered.to(torch.int64) * 2**32 + (2**32 - 1 - order)


class ShardedMaxSimIndex(RankGroup):
    """A document collection split across the ranks of a process group, searched exactly.

    Every rank constructs the index with its own documents (collective: every rank of ``group``
    must construct it, in the same order as its other collectives). Global document ids are
    contiguous by rank (rank 0's documents first) unless ``ids`` gives them. :meth:`topk` returns
    on every rank what :func:`late_interaction_kernels.retrieve` returns for the whole collection
    in one process (ids in place of positions), equal scores ordered by smaller id.

    Without an initialised process group (or with one rank) the index is a single shard.

    Args:
        documents: this rank's documents: a ``(n, Ld, d)`` tensor (padded; give ``d_mask``) or a
            list of ``(L_i, d)`` tensors of uneven lengths (padded chunk by chunk when scored).
            ``n`` may be 0 on some ranks.
        d_mask: bool ``(n, Ld)``, True = valid token; only with a tensor ``documents``.
        ids: int64 ``(n,)`` global ids of this rank's documents (non-negative, distinct; distinct
            across ranks too, which is not checked). Default: contiguous by rank.
        group: the process group (default: the default group).
        device: where to hold this shard (default: where ``documents`` are).
        normalize: L2-normalise every token before scoring (default True, as
            :func:`~late_interaction_kernels.retrieve`; :class:`MaxSimIndex` defaults to False).
        chunk_size: documents scored per chunk on the chunked path (default: as
            :func:`~late_interaction_kernels.ops.maxsim_topk.maxsim_topk`).
        backend: force ``"triton"``, ``"interpret"`` or ``"torch"`` (default: by device).

    Raises:
        ValueError / TypeError: on every rank when any rank's documents or ids are bad (the rank
            at fault raises its own error naming the argument), or when the ranks' documents
            disagree in width or dtype.

    Example (``torchrun --nproc_per_node=2 search.py``)::

        dist.init_process_group("nccl")
        torch.cuda.set_device(dist.get_rank())
        index = ShardedMaxSimIndex.from_full_corpus(corpus, corpus_mask, device="cuda")
        scores, ids = index.topk(queries.cuda(), k=100)  # the same on every rank
    """

    def __init__(
        self,
        documents: torch.Tensor | Sequence[torch.Tensor],
        d_mask: torch.Tensor | None = None,
        *,
        ids: torch.Tensor | None = None,
        group: dist.ProcessGroup | None = None,
        device: torch.device | str | None = None,
        normalize: bool = True,
        chunk_size: int | None = None,
        backend: str | None = None,
    ) -> None:
        self._setup_group(group)
        error: Exception | None = None
        try:
            if chunk_size is not None and (
                isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
            ):
                raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
            block = _make_block(documents, d_mask, "documents")
            if device is None:
                device = _block_facts(block)[2] or self._default_device()
            self.device = torch.device(device)
        except (TypeError, ValueError) as exc:
            error, block = exc, None
            self.device = torch.device("cpu")
        self.normalize = bool(normalize)
        self.chunk_size = chunk_size
        self.backend = backend
        self._blocks: list[_Block] = []
        self._ids = torch.empty(0, dtype=torch.int64, device=self.device)
        self._order: torch.Tensor | None = None
        self._counts = [0] * self.world_size
        self._next_id = 0
        self.dim = 0
        self.dtype: torch.dtype | None = None
        self._append([block] if block is not None else [], ids, error)

    # -- construction ---------------------------------------------------------------------------

    def _append(self, blocks: list[_Block], ids, error: Exception | None) -> None:
        """Add ``blocks`` (this rank's) with ``ids`` or fresh ones: the collective step of the
        constructor, :meth:`add` and :meth:`load`."""
        n_new = dim = dtype_code = has_ids = 0
        max_id = -1
        if error is None:
            try:
                n_new = sum(len(b) for b in blocks)
                for b in blocks:
                    d, dtype, _ = _block_facts(b)
                    if len(b) == 0 and b.padded is None:
                        continue
                    if dtype not in _DTYPES:
                        raise TypeError(
                            f"documents must be float16, bfloat16, float32 or float64, got {dtype}"
                        )
                    if (dim and d != dim) or (self.dim and d != self.dim):
                        raise ValueError(
                            f"documents have width d={d}, the index holds d={self.dim or dim}"
                        )
                    if (dtype_code and _DTYPES[dtype_code - 1] != dtype) or (
                        self.dtype is not None and dtype != self.dtype
                    ):
                        raise TypeError(
                            f"documents are {dtype}, the index holds "
                            f"{self.dtype or _DTYPES[dtype_code - 1]}"
                        )
                    dim, dtype_code = d, _DTYPES.index(dtype) + 1
                if ids is not None:
                    ids = self._check_ids(ids, n_new)
                    has_ids = 1
                    max_id = int(ids.max()) if n_new else -1
            except (TypeError, ValueError) as exc:
                error = exc
        rows = self._agree(error, [n_new, dim, dtype_code, has_ids, max_id])
        dims = {row[1] for row in rows if row[1]} | ({self.dim} if self.dim else set())
        codes = {row[2] for row in rows if row[2]}
        if self.dtype is not None:
            codes.add(_DTYPES.index(self.dtype) + 1)
        if len(dims) > 1:
            raise ValueError(f"the ranks' documents have different widths d: {sorted(dims)}")
        if len(codes) > 1:
            names = sorted(str(_DTYPES[c - 1]) for c in codes)
            raise TypeError(f"the ranks' documents have different dtypes: {names}")
        # fresh ids follow every id held or given, contiguous by rank
        start = max([self._next_id] + [row[4] + 1 for row in rows])
        fresh = [row[0] if not row[3] else 0 for row in rows]
        if ids is None:
            first = start + sum(fresh[: self.rank])
            ids = torch.arange(first, first + n_new, dtype=torch.int64)
        self._next_id = start + sum(fresh)
        self._counts = [c + row[0] for c, row in zip(self._counts, rows)]
        if dims:
            self.dim = dims.pop()
        if codes:
            self.dtype = _DTYPES[codes.pop() - 1]
        held = sum(len(b) for b in self._blocks)
        for b in blocks:
            if len(b) == 0:
                continue
            b.start = held
            held += len(b)
            if b.padded is not None:
                b.padded = b.padded.to(self.device)
                b.mask = None if b.mask is None else b.mask.to(self.device)
            else:
                b.docs = [doc.to(self.device) for doc in b.docs]
            self._blocks.append(b)
        self._ids = torch.cat([self._ids, ids.to(self.device)])
        # local order = id order lets the fused kernel and the chunk keys break ties by id
        # directly; otherwise each document's rank among this shard's ids stands in for it
        if len(self._ids) > 1 and not bool((self._ids[1:] > self._ids[:-1]).all()):
            self._order = torch.empty_like(self._ids)
            self._order[self._ids.argsort()] = torch.arange(len(self._ids), device=self.device)
        else:
            self._order = None

    def _check_ids(self, ids, n: int) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or ids.dim() != 1:
            raise TypeError(f"ids must be an int64 tensor of shape ({n},), got {_describe(ids)}")
        if ids.shape[0] != n:
            raise ValueError(
                f"ids must have shape ({n},) (one per document), got {tuple(ids.shape)}"
            )
        if n:
            if int(ids.min()) < 0 or int(ids.max()) == _NO_DOC:
                raise ValueError(f"ids must lie in [0, {_NO_DOC - 1}]")
            held = torch.cat([self._ids.cpu(), ids.cpu()])
            if held.unique().numel() != held.numel():
                raise ValueError("ids must be distinct (from each other and from the ids held)")
        return ids

    @classmethod
    def from_full_corpus(
        cls,
        documents: torch.Tensor | Sequence[torch.Tensor],
        d_mask: torch.Tensor | None = None,
        *,
        group: dist.ProcessGroup | None = None,
        device: torch.device | str | None = None,
        **options,
    ) -> ShardedMaxSimIndex:
        """The index of a collection every rank holds whole (on the CPU, say): each rank keeps
        its contiguous slice (:meth:`shard_range`), sliced before it moves to ``device``, so only
        the shard reaches the device. Global ids are the documents' positions in ``documents``.
        Collective; ``options`` as in the constructor."""
        n = len(documents) if isinstance(documents, (torch.Tensor, Sequence)) else -1
        lo, hi = cls.shard_range(max(n, 0), group=group)
        shard, mask = documents, d_mask
        if n >= 0:
            shard = documents[lo:hi]
            if isinstance(shard, torch.Tensor):
                shard = shard if device is None else shard.to(device)
            else:
                shard = [doc if device is None else doc.to(device) for doc in shard]
        if isinstance(d_mask, torch.Tensor) and d_mask.dim() >= 1 and d_mask.shape[0] == n:
            mask = d_mask[lo:hi] if device is None else d_mask[lo:hi].to(device)
        index = cls(shard, mask, group=group, device=device, **options)
        sizes = [row[0] for row in index._agree(None, [n])]
        if len(set(sizes)) > 1:
            raise ValueError(
                "from_full_corpus needs the same collection on every rank; the ranks' "
                f"collections hold {sizes} documents"
            )
        return index

    @classmethod
    def from_index(
        cls,
        index: MaxSimIndex,
        *,
        ids: torch.Tensor | None = None,
        group: dist.ProcessGroup | None = None,
        device: torch.device | str | None = None,
        backend: str | None = None,
    ) -> ShardedMaxSimIndex:
        """The sharded index whose shard on this rank is ``index`` (say one
        ``MaxSimIndex.load(f"part-{rank}.pt")`` per rank), with its ``normalize`` and
        ``chunk_size``. Collective."""
        if not isinstance(index, MaxSimIndex):
            raise TypeError(f"index must be a MaxSimIndex, got {type(index).__name__}")
        documents = index._padded if index._padded is not None else index._list
        return cls(
            documents, index.d_mask, ids=ids, group=group, device=device,
            normalize=index.normalize, chunk_size=index.chunk_size, backend=backend,
        )  # fmt: skip

    @staticmethod
    def _rank_and_world(group) -> tuple[int, int]:
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(group), dist.get_world_size(group)
        return 0, 1

    @staticmethod
    def shard_range(n: int, *, group: dist.ProcessGroup | None = None) -> tuple[int, int]:
        """``(lo, hi)``: the documents ``[lo, hi)`` of ``n`` this rank holds under
        :meth:`from_full_corpus` (balanced contiguous slices; ``(0, n)`` without a group)."""
        rank, world = ShardedMaxSimIndex._rank_and_world(group)
        return n * rank // world, n * (rank + 1) // world

    def add(
        self,
        documents: torch.Tensor | Sequence[torch.Tensor] | None = None,
        d_mask: torch.Tensor | None = None,
        *,
        ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Add documents to this rank's shard. Collective: every rank calls it, a rank with
        nothing to add passes nothing. Fresh global ids follow the largest id held, contiguous by
        rank; nothing already held is copied. Returns the new documents' ids (int64)."""
        error: Exception | None = None
        blocks: list[_Block] = []
        try:
            if documents is not None:
                blocks = [_make_block(documents, d_mask, "documents")]
            elif d_mask is not None:
                raise ValueError("d_mask was given without documents")
        except (TypeError, ValueError) as exc:
            error = exc
        before = len(self._ids)
        self._append(blocks, ids, error)
        return self._ids[before:]

    # -- state ----------------------------------------------------------------------------------

    def __len__(self) -> int:
        """The number of documents over all ranks."""
        return sum(self._counts)

    @property
    def local_size(self) -> int:
        """The number of documents in this rank's shard."""
        return self._counts[self.rank]

    @property
    def counts(self) -> tuple[int, ...]:
        """Documents per rank."""
        return tuple(self._counts)

    @property
    def ids(self) -> torch.Tensor:
        """The global ids of this rank's documents, in the order they were given (int64)."""
        return self._ids

    def __repr__(self) -> str:
        return (
            f"ShardedMaxSimIndex(documents={len(self)}, rank={self.rank}/{self.world_size}, "
            f"local={self.local_size}, d={self.dim}, dtype={self.dtype}, device={self.device}, "
            f"normalize={self.normalize})"
        )

    # -- search ---------------------------------------------------------------------------------

    def _check_queries(self, Q, k, q_mask) -> None:
        if isinstance(k, bool) or not isinstance(k, int):
            raise TypeError(f"k must be an int, got {type(k).__name__}")
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        if not isinstance(Q, torch.Tensor) or Q.dim() != 3:
            raise ValueError(f"Q must be a (Nq, Lq, d) or (Lq, d) tensor, got {_describe(Q)}")
        if self.dim and Q.shape[-1] != self.dim:
            raise ValueError(f"Q has embedding width {Q.shape[-1]}, the documents have {self.dim}")
        if self.dtype is not None and Q.dtype != self.dtype:
            raise TypeError(f"Q must be {self.dtype} like the documents, got {Q.dtype}")
        _check_query_mask(Q, q_mask)

    @torch.no_grad()
    def topk(
        self,
        Q: torch.Tensor,
        k: int,
        q_mask: torch.Tensor | None = None,
        *,
        check_ranks: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` best documents per query over every rank's shard. Collective: every rank
        passes the same queries and gets the same result.

        Args:
            Q: ``(Nq, Lq, d)`` or ``(Lq, d)`` queries (moved to the shard's device).
            k: results per query, clamped to the number of documents (as
                :func:`~late_interaction_kernels.retrieve`); must be positive.
            q_mask: bool ``(Nq, Lq)``, True = valid token.
            check_ranks: first make sure every rank's arguments are valid and of one shape (a
                small collective and a host sync): a bad argument on one rank then raises on every
                rank. Without it a rank whose arguments are bad raises at once and the others
                wait in the exchange until the process group's timeout.

        Returns:
            ``(scores float32, ids int64)``, each ``(Nq, min(k, len(self)))`` (``(min(k,
            len(self)),)`` for a 2-D ``Q``), best first, equal scores by smaller id, on the
            shard's device.

        Raises:
            ValueError: on every rank when the collection is empty on every rank.
        """
        squeeze = isinstance(Q, torch.Tensor) and Q.dim() == 2
        if squeeze:
            Q = Q.unsqueeze(0)
            q_mask = q_mask.unsqueeze(0) if isinstance(q_mask, torch.Tensor) else q_mask
        error: Exception | None = None
        try:
            self._check_queries(Q, k, q_mask)
        except (TypeError, ValueError) as exc:
            error = exc
        if check_ranks and self.world_size > 1:
            shape = [-1] * 6 if error else [*Q.shape, k, int(q_mask is not None), _code(Q.dtype)]
            rows = self._agree(error, shape)
            if any(row != rows[0] for row in rows):
                raise ValueError(
                    "the ranks passed queries of different shapes or k (Nq, Lq, d, k, q_mask, "
                    f"dtype per rank: {rows}); every rank must pass the same queries"
                )
        elif error is not None:
            raise error
        total = len(self)
        if total == 0:
            raise ValueError(
                "the collection is empty on every rank (add documents before searching)"
            )
        k = min(k, total)
        Q = Q.to(self.device, non_blocking=True)
        q_mask = None if q_mask is None else q_mask.to(self.device, non_blocking=True)
        scores, ids = self._local_topk(Q, min(k, self.local_size), q_mask)
        if self.world_size > 1:
            scores, ids = self._exchange(scores, ids, k)
        return (scores.squeeze(0), ids.squeeze(0)) if squeeze else (scores, ids)

    def _local_topk(self, Q, k: int, q_mask) -> tuple[torch.Tensor, torch.Tensor]:
        """This shard's ``k`` best ``(scores, global ids)``, ties broken by global id."""
        nq = Q.shape[0]
        if k == 0 or nq == 0:
            return (
                torch.empty(nq, k, dtype=torch.float32, device=self.device),
                torch.empty(nq, k, dtype=torch.int64, device=self.device),
            )
        fused = (
            self._order is None
            and nq <= FUSED_MAX_QUERIES
            and uses_triton(select_backend(device=self.device, backend=self.backend))
        )
        step = self.chunk_size or max(MIN_CHUNK_SIZE, CHUNK_SCORES // nq)
        best = None
        for block in self._blocks:
            if fused and block.padded is not None:
                take = min(k, len(block))
                if fused_covers(Q, block.padded, take):  # the declared op's fused kernel
                    s, i = TOPK(Q, block.padded, q_mask, block.mask, k=take,
                                normalize=self.normalize, backend=self.backend)  # fmt: skip
                    best = self._keep(best, s, i + block.start, k)
                    continue
            for start, D, mask in block.chunks(step):
                s = maxsim_unchecked(
                    Q, D, q_mask, mask, normalize=self.normalize, backend=self.backend
                ).float()
                i = torch.arange(start, start + s.shape[1], device=s.device).expand_as(s)
                best = self._keep(best, s, i, k)
        _, scores, local = best
        return scores, self._ids[local]

    def _keep(self, best, scores, local, k: int):
        """Merge candidates ``(scores, local indices)`` into the running ``(keys, scores,
        local indices)``."""
        order = local if self._order is None else self._order[local]
        keys = _keys(scores, order)
        if best is not None:
            keys = torch.cat([best[0], keys], dim=1)
            scores = torch.cat([best[1], scores], dim=1)
            local = torch.cat([best[2], local], dim=1)
        keys, where = keys.topk(min(k, keys.shape[1]), dim=1)
        return keys, scores.gather(1, where), local.gather(1, where)

    # -- files ----------------------------------------------------------------------------------

    def save(self, directory: str | os.PathLike) -> str:
        """Write this rank's shard to ``directory/shard-RRRRR-of-WWWWW.pt`` (rank counted from
        1; its documents as a :class:`MaxSimIndex` file holds them, with their global ids).
        Collective: returns once every rank has written, and raises on every rank if any could
        not. Returns this rank's file."""
        path = os.path.join(os.fspath(directory), _FILE.format(self.rank + 1, self.world_size))
        error: Exception | None = None
        try:
            os.makedirs(directory, exist_ok=True)
            state = {
                "format": SHARD_FORMAT,
                "rank": self.rank,
                "world_size": self.world_size,
                "normalize": self.normalize,
                "chunk_size": self.chunk_size,
                "dim": self.dim,
                "dtype": None if self.dtype is None else str(self.dtype),
                "next_id": self._next_id,
                "ids": self._ids,
                "blocks": [
                    b.state(self.chunk_size or DEFAULT_CHUNK_SIZE, self.normalize)
                    for b in self._blocks
                ],
            }
            tmp = path + ".tmp"
            torch.save(state, tmp)
            os.replace(tmp, path)
        except (OSError, RuntimeError) as exc:
            error = ValueError(f"could not write {path!r}: {exc}")
        self._agree(error, [])
        return path

    @classmethod
    def load(
        cls,
        directory: str | os.PathLike,
        *,
        group: dist.ProcessGroup | None = None,
        device: torch.device | str | None = None,
        backend: str | None = None,
    ) -> ShardedMaxSimIndex:
        """The index written by :meth:`save` into ``directory``: each rank reads its own file
        (onto ``device``, default where it was saved). Collective; the world size must be the one
        it was saved with (else ``ValueError`` on every rank). A missing or unreadable shard file
        raises ``ValueError`` naming it on its rank (and ``ValueError`` on every other rank)."""
        index = cls.__new__(cls)
        index._setup_group(group)
        rank, world = index.rank, index.world_size
        path = os.path.join(os.fspath(directory), _FILE.format(rank + 1, world))
        error: Exception | None = None
        blocks: list[_Block] = []
        ids = None
        normalize, chunk_size, next_id = True, None, 0
        try:
            if not os.path.exists(path):
                sizes = sorted(
                    {
                        int(m.group(2))
                        for f in glob.glob(os.path.join(os.fspath(directory), "shard-*-of-*.pt"))
                        if (m := _FILE_RE.search(f))
                    }
                )
                saved = f"it holds shards of {sizes} ranks" if sizes else "it holds no shard file"
                raise ValueError(
                    f"no shard file {os.path.basename(path)!r} in {os.fspath(directory)!r} for rank "
                    f"{rank} of {world}: {saved}; load with the world size it was saved with"
                )
            state = read_index_file(path, device, "ShardedMaxSimIndex shard")
            if not isinstance(state, dict) or state.get("format") != SHARD_FORMAT:
                raise ValueError(f"{path!r} is not a ShardedMaxSimIndex shard file")
            if state.get("rank") != rank or state.get("world_size") != world:
                raise ValueError(
                    f"{path!r} holds rank {state.get('rank')} of {state.get('world_size')}, "
                    f"loading as rank {rank} of {world}"
                )
            try:
                for b in state["blocks"]:
                    part = MaxSimIndex._from_state(b, path)
                    if part._padded is not None:
                        blocks.append(_Block(0, part._padded, part.d_mask, None))
                    else:
                        blocks.append(_Block(0, None, None, part._list))
                ids = state["ids"]
                n = sum(len(b) for b in blocks)
                if (
                    not isinstance(ids, torch.Tensor)
                    or ids.dtype != torch.int64
                    or ids.shape != (n,)
                ):
                    raise ValueError(
                        f"{path!r}: ids must be an int64 tensor of shape ({n},), "
                        f"got {_describe(ids)}"
                    )
                normalize = bool(state.get("normalize", True))
                chunk_size = state.get("chunk_size")
                next_id = state.get("next_id", 0)
                if not (chunk_size is None or _int_at_least(chunk_size, 1)) or not _int_at_least(
                    next_id, 0
                ):
                    raise ValueError(
                        f"{path!r}: chunk_size must be a positive int or None and next_id an int "
                        f">= 0, got {chunk_size!r} and {next_id!r}"
                    )
            except KeyError as exc:
                raise ValueError(f"{path!r} is missing the field {exc}") from exc
            except (TypeError, AttributeError) as exc:
                raise ValueError(f"{path!r} does not hold a valid shard: {exc}") from exc
            index.device = torch.device(
                device
                if device is not None
                else ids.device
                if not blocks
                else _block_facts(blocks[0])[2] or ids.device
            )
        except (OSError, RuntimeError, ValueError, TypeError) as exc:
            if isinstance(exc, ValueError):
                error = exc
            else:
                error = ValueError(f"{path!r}: {exc!r}")
                error.__cause__ = exc
            index.device = torch.device("cpu")
            blocks, ids, normalize, chunk_size, next_id = [], None, True, None, 0
        index.normalize = normalize
        index.chunk_size = chunk_size
        index.backend = backend
        index._blocks = []
        index._ids = torch.empty(0, dtype=torch.int64, device=index.device)
        index._order = None
        index._counts = [0] * world
        index._next_id = 0
        index.dim = 0
        index.dtype = None
        index._append(blocks, ids, error)
        index._next_id = max(index._next_id, next_id)
        return index


def _int_at_least(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) + 1 if dtype in _DTYPES else 0
