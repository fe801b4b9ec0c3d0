""":class:`ShardedCompressedIndex`: a :class:`~late_interaction_kernels.CompressedMaxSimIndex` per
rank of a ``torch.distributed`` process group, for collections past one GPU. Each rank compresses
and searches its own documents; the ranks then exchange ``k`` candidates per query in one
``all_gather`` and each merges them into the same global top-k (equal scores by smaller id)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from ..ops.compressed import CompressedMaxSimIndex
from ..ops.retrieve.validation import describe
from .ranks import _NO_DOC, RankGroup

__all__ = ["ShardedCompressedIndex"]

_FILE = "compressed-{:05d}-of-{:05d}.pt"
_IDS_FILE = "compressed-{:05d}-of-{:05d}.ids.pt"


def _is_empty(documents) -> bool:
    return documents is None or (not isinstance(documents, torch.Tensor) and len(documents) == 0)


class ShardedCompressedIndex(RankGroup):
    """A compressed index split across the ranks of a process group.

    Every rank constructs it with its own documents (collective; a rank may pass none). Global
    ids are contiguous by rank (rank 0's documents first), and :meth:`add` gives new documents
    the ids after the largest one. With the exact rerank (``keep_full``, the default) and a
    search that reaches every relevant document, :meth:`search` returns what one process with
    the whole collection returns.

    Args:
        documents: this rank's documents (a list of ``(L_i, d)`` tensors, or packed tokens with
            ``lengths``), or ``None`` / ``[]``.
        lengths: with packed tokens.
        group: the process group (default: the default group; none initialised: one shard).
        device: where this rank's shard lives (default: this rank's GPU under NCCL, else CPU).
        **build_options: passed to :meth:`CompressedMaxSimIndex.build` on every rank.

    Raises:
        ValueError / TypeError: on every rank when any rank's documents are bad (the rank at
            fault raises its own error).
    """

    def __init__(
        self,
        documents: Sequence[torch.Tensor] | torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        *,
        group: Any = None,
        device: torch.device | str | None = None,
        **build_options: Any,
    ) -> None:
        self._setup_group(group)
        self.device = torch.device(device) if device is not None else self._default_device()
        self.build_options = build_options
        self.local: CompressedMaxSimIndex | None = None
        self._ids = torch.empty(0, dtype=torch.int64)
        self._live: list[int] = [0] * self.world_size
        self._next_id = 0
        self._grow(documents, lengths)

    # -- construction and changes --------------------------------------------------------------
    def _grow(self, documents, lengths) -> torch.Tensor:
        """Compress (first call) or add this rank's documents; collective. Global ids of the new
        documents of this rank."""
        error: Exception | None = None
        n_new = 0
        if not _is_empty(documents):
            try:
                if self.local is None:
                    self.local = CompressedMaxSimIndex.build(documents, lengths, device=self.device,
                                                             **self.build_options)  # fmt: skip
                    n_new = self.local.n_slots
                else:
                    n_new = self.local.add(documents, lengths).numel()
            except (TypeError, ValueError) as exc:
                error = exc
        sizes = [row[0] for row in self._agree(error, [n_new])]
        first = self._next_id + sum(sizes[: self.rank])
        new = torch.arange(first, first + n_new, dtype=torch.int64)
        self._ids = torch.cat([self._ids, new])
        self._next_id += sum(sizes)
        self._sync_counts()
        return new

    def _sync_counts(self) -> None:
        here = len(self.local) if self.local is not None else 0
        self._live = [row[0] for row in self._agree(None, [here])]

    def add(
        self, documents: Sequence[torch.Tensor] | torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """Add this rank's documents (collective; a rank with nothing passes ``None``): the
        global int64 ids of this rank's new documents."""
        return self._grow(documents, lengths)

    def delete(self, ids: torch.Tensor | Sequence[int]) -> None:
        """Remove documents by global id (collective: every rank passes the same ids; each
        removes those it holds). Unknown ids raise ``ValueError`` on every rank."""
        error: Exception | None = None
        try:
            ids = torch.as_tensor(ids)
            if ids.is_floating_point() or ids.dtype == torch.bool or ids.dim() > 1:
                raise ValueError(f"ids must be integer document ids, got {describe(ids)}")
            ids = ids.reshape(-1).long()
            mine = torch.isin(self._ids, ids)
            held = int(mine.sum())
        except (TypeError, ValueError) as exc:
            error, held = exc, 0
        rows = self._agree(error, [held])
        if sum(r[0] for r in rows) != torch.unique(ids).numel():
            raise ValueError("ids holds ids that no rank holds")
        if held:
            self.local.delete(mine.nonzero().squeeze(1))
        self._sync_counts()

    def __len__(self) -> int:
        """Live documents on every rank together."""
        return sum(self._live)

    # -- search --------------------------------------------------------------------------------
    @torch.no_grad()
    def search(
        self, Q: torch.Tensor, k: int, q_mask: torch.Tensor | None = None, **search_options: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` best documents per query over every rank (collective: every rank passes the
        same queries and gets the same result). ``k`` is clamped to the live documents;
        ``search_options`` as :meth:`CompressedMaxSimIndex.search`. Returns ``(scores float32,
        global ids int64)``, ``(Nq, k)`` (``(k,)`` for a 2-D ``Q``)."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        if len(self) == 0:
            raise ValueError("the collection is empty on every rank (add documents before searching)")
        squeeze = isinstance(Q, torch.Tensor) and Q.dim() == 2
        if squeeze:
            Q = Q.unsqueeze(0)
            q_mask = q_mask.unsqueeze(0) if isinstance(q_mask, torch.Tensor) else q_mask
        k = min(k, len(self))
        take = min(k, self._live[self.rank])
        if not isinstance(Q, torch.Tensor) or Q.dim() != 3:
            raise ValueError(f"Q must be a (Nq, Lq, d) or (Lq, d) tensor, got {describe(Q)}")
        nq = Q.shape[0]
        if take:
            scores, local = self.local.search(Q, take, q_mask, **search_options)
            ids = torch.where(local >= 0, self._ids.to(local.device)[local.clamp_min(0)], _NO_DOC)
        else:
            scores = torch.empty(nq, 0, device=self.device)
            ids = torch.empty(nq, 0, dtype=torch.int64, device=self.device)
        scores, ids = scores.to(self.device), ids.to(self.device)
        if self.world_size > 1:
            scores, ids = self._exchange(scores, ids, k)
        return (scores[0], ids[0]) if squeeze else (scores, ids)

    # -- files ---------------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> None:
        """Write this rank's shard to ``directory`` (collective: returns once every rank wrote)."""
        error: Exception | None = None
        try:
            os.makedirs(directory, exist_ok=True)
            name = (self.rank + 1, self.world_size)
            if self.local is not None:
                self.local.save(os.path.join(directory, _FILE.format(*name)))
            torch.save({"ids": self._ids, "next_id": self._next_id},
                       os.path.join(directory, _IDS_FILE.format(*name)))  # fmt: skip
        except OSError as exc:
            error = ValueError(f"could not write the shard into {os.fspath(directory)!r}: {exc}")
        self._agree(error, [])

    @classmethod
    def load(
        cls, directory: str | os.PathLike, *, group: Any = None, device: torch.device | str | None = None
    ) -> ShardedCompressedIndex:
        """The index :meth:`save` wrote, with the same number of ranks (collective)."""
        index = cls.__new__(cls)
        index._setup_group(group)
        index.device = torch.device(device) if device is not None else index._default_device()
        index.build_options = {}
        error: Exception | None = None
        index.local, index._ids, index._next_id = None, torch.empty(0, dtype=torch.int64), 0
        try:
            name = (index.rank + 1, index.world_size)
            ids_path = os.path.join(directory, _IDS_FILE.format(*name))
            if not os.path.exists(ids_path):
                raise ValueError(f"{os.fspath(directory)!r} holds no shard {name[0]} of {name[1]}")
            meta = torch.load(ids_path, weights_only=True)
            index._ids, index._next_id = meta["ids"], int(meta["next_id"])
            path = os.path.join(directory, _FILE.format(*name))
            if os.path.exists(path):
                index.local = CompressedMaxSimIndex.load(path, device=index.device)
        except (ValueError, KeyError, TypeError) as exc:
            error = exc if isinstance(exc, ValueError) else ValueError(f"bad shard file: {exc}")
        index._agree(error, [])
        index._sync_counts()
        return index
