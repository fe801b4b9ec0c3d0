"""The :class:`MaxSimIndex` collection: validation of the documents, saving and loading, and
chunked scoring with a running top-k."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import torch

from ..maxsim import maxsim_unchecked
from .validation import check_queries, describe

#: Documents scored per chunk when none is given.
DEFAULT_CHUNK_SIZE = 4096
#: The on-disk layout :meth:`MaxSimIndex.save` writes (kept by :meth:`MaxSimIndex.load`).
INDEX_FORMAT = 1


def read_index_file(path: str | os.PathLike, device, kind: str):
    """``torch.load`` of one index file (``weights_only``); a file that torch cannot read raises
    ``ValueError`` naming it, the reader's error chained."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except (OSError, MemoryError, torch.cuda.OutOfMemoryError):
        # A path that cannot be opened or a machine out of memory says nothing about the file's
        # contents, and these errors already name their cause.
        raise
    except Exception as exc:
        # torch.load fails on a file of another format with whatever its reader trips on first
        # (UnpicklingError, KeyError, EOFError, the zip reader's RuntimeError, ...). Its first
        # line is enough here: the weights-only message runs for a page, with terminal colour
        # codes, and the whole error stays chained.
        first_line = re.sub(r"\x1b\[[0-9;]*m", "", (str(exc).splitlines() or [""])[0])[:200]
        raise ValueError(
            f"{os.fspath(path)!r} is not a readable {kind} file "
            f"({type(exc).__name__}: {first_line})"
        ) from exc


def pad_documents(docs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(padded (n, max L, d), bool mask (n, max L))`` of a non-empty list of ``(L_i, d)``
    documents, the padding masked out."""
    lengths = torch.tensor([doc.shape[0] for doc in docs], device=docs[0].device)
    padded = torch.nn.utils.rnn.pad_sequence(list(docs), batch_first=True)
    mask = torch.arange(padded.shape[1], device=padded.device) < lengths[:, None]
    return padded, mask


class MaxSimIndex:
    """A document collection held for repeated scoring and top-k search.

    Args:
        documents: ``(Nd, Ld, d)`` tensor (padded; give ``d_mask``) or a sequence of ``(L_i, d)``
            tensors of uneven lengths (padded chunk by chunk, the padding masked out).
        d_mask: bool ``(Nd, Ld)``, True = valid token; only with a tensor ``documents``.
        chunk_size: documents per chunk (default :data:`DEFAULT_CHUNK_SIZE`).
        normalize: L2-normalise every token before scoring.

    Example:
        >>> index = MaxSimIndex(doc_embeddings, d_mask)
        >>> scores, ids = index.topk(query_embeddings, k=10)
    """

    def __init__(
        self,
        documents: torch.Tensor | Sequence[torch.Tensor],
        d_mask: torch.Tensor | None = None,
        *,
        chunk_size: int | None = None,
        normalize: bool = False,
    ) -> None:
        if chunk_size is None:
            chunk_size = DEFAULT_CHUNK_SIZE
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        if isinstance(documents, torch.Tensor):
            if documents.dim() != 3:
                raise ValueError(
                    f"documents must be (Nd, Ld, d) or a list of (L, d) tensors, got {describe(documents)}"
                )
            if d_mask is not None and (
                not isinstance(d_mask, torch.Tensor)
                or d_mask.dtype != torch.bool
                or tuple(d_mask.shape) != tuple(documents.shape[:2])
            ):
                raise ValueError(
                    f"d_mask must be a bool tensor of shape {tuple(documents.shape[:2])}, got {describe(d_mask)}"
                )
            self._padded, self._list = documents, None
            self.dim = documents.shape[-1]
        else:
            if d_mask is not None:
                raise ValueError(
                    "d_mask is only accepted with a (Nd, Ld, d) tensor; a list of documents is masked by its lengths"
                )
            docs = list(documents)
            for i, doc in enumerate(docs):
                if not isinstance(doc, torch.Tensor) or doc.dim() != 2:
                    raise ValueError(
                        f"documents[{i}] must be an (L, d) tensor, got {describe(doc)}"
                    )
            if docs and any(doc.shape[-1] != docs[0].shape[-1] for doc in docs):
                raise ValueError("every document must have the same embedding width d")
            self._padded, self._list = None, docs
            self.dim = docs[0].shape[-1] if docs else 0
        self.d_mask = d_mask
        self.chunk_size = chunk_size
        self.normalize = normalize

    def __len__(self) -> int:
        return self._padded.shape[0] if self._padded is not None else len(self._list)

    def save(self, path: str | os.PathLike) -> None:
        """Write the index to one file (``torch.save`` of tensors and plain values; a list of
        uneven documents is stored packed, with its lengths)."""
        torch.save(self._state(), path)

    def _state(self) -> dict:
        """What :meth:`save` writes (also a part of a sharded index's per-rank files)."""
        state: dict = {
            "format": INDEX_FORMAT,
            "chunk_size": self.chunk_size,
            "normalize": self.normalize,
            "dim": int(self.dim),
            "d_mask": self.d_mask,
        }
        if self._padded is not None:
            state["documents"] = self._padded
        else:
            state["lengths"] = torch.tensor([doc.shape[0] for doc in self._list], dtype=torch.int64)
            state["packed"] = torch.cat(self._list) if self._list else torch.empty(0, self.dim)
        return state

    @classmethod
    def load(
        cls, path: str | os.PathLike, *, device: torch.device | str | None = None
    ) -> MaxSimIndex:
        """An index written by :meth:`save`, on ``device`` (default: where it was saved). Only
        tensors and plain values are unpickled (``weights_only``). A file that is not an index
        (not a torch file, a damaged one, or one without an index's fields) raises ``ValueError``
        naming it; a path that cannot be opened raises the ``OSError`` of the open
        (``FileNotFoundError`` for a missing file)."""
        state = read_index_file(path, device, "MaxSimIndex")
        return cls._from_state(state, os.fspath(path))

    @classmethod
    def _from_state(cls, state, source: str) -> MaxSimIndex:
        """The index of a :meth:`_state` dict read from ``source`` (named in errors)."""
        if not isinstance(state, dict) or state.get("format") != INDEX_FORMAT:
            raise ValueError(f"{source!r} is not a MaxSimIndex file (format {INDEX_FORMAT})")
        try:
            return cls._build(state)
        except KeyError as exc:
            raise ValueError(f"{source!r} is missing the field {exc}") from exc
        except (TypeError, ValueError, AttributeError, IndexError, RuntimeError) as exc:
            # The constructor's own messages name its arguments, which a user loading a file
            # never passed: say which file holds the bad value.
            raise ValueError(f"{source!r} does not hold a valid MaxSimIndex: {exc}") from exc

    @classmethod
    def _build(cls, state: dict) -> MaxSimIndex:
        options = {"chunk_size": state["chunk_size"], "normalize": state["normalize"]}
        if "documents" in state:
            return cls(state["documents"], state["d_mask"], **options)
        lengths = [int(n) for n in state["lengths"]]
        packed, dim = state["packed"], state["dim"]
        if not isinstance(packed, torch.Tensor) or packed.dim() != 2:
            raise ValueError(f"packed must be a (total, d) tensor, got {describe(packed)}")
        if isinstance(dim, bool) or dim != packed.shape[1]:
            raise ValueError(f"dim {dim!r} is not the packed rows' width {packed.shape[1]}")
        if sum(lengths) != packed.shape[0] or min(lengths, default=0) < 0:
            raise ValueError("the lengths do not add up to the packed rows")
        index = cls(list(packed.split(lengths)) if lengths else [], **options)
        index.dim = dim
        return index

    def _chunks(self):
        """Yield ``(start, D_chunk, d_mask_chunk)``."""
        n = len(self)
        for start in range(0, n, self.chunk_size):
            stop = min(start + self.chunk_size, n)
            if self._padded is not None:
                mask = None if self.d_mask is None else self.d_mask[start:stop]
                yield start, self._padded[start:stop], mask
            else:
                yield start, *pad_documents(self._list[start:stop])

    def _check(self, Q, q_mask):
        """``(Q, q_mask, squeeze)``: a single ``(Lq, d)`` query (and its ``(Lq,)`` mask) as a
        batch of one, checked."""
        squeeze = isinstance(Q, torch.Tensor) and Q.dim() == 2
        if squeeze:
            Q = Q.unsqueeze(0)
            if isinstance(q_mask, torch.Tensor) and q_mask.dim() == 1:
                q_mask = q_mask.unsqueeze(0)
        check_queries(Q, q_mask)
        if len(self) == 0:
            raise ValueError("the document collection is empty (documents has no rows)")
        if Q.shape[-1] != self.dim:
            raise ValueError(f"Q has embedding width {Q.shape[-1]}, the documents have {self.dim}")
        return Q, q_mask, squeeze

    @torch.no_grad()
    def scores(self, Q: torch.Tensor, q_mask: torch.Tensor | None = None) -> torch.Tensor:
        """All scores, float32 ``(Nq, Nd)`` (the full matrix: use :meth:`topk` for large
        collections); ``(Nd,)`` for a single ``(Lq, d)`` query."""
        Q, q_mask, squeeze = self._check(Q, q_mask)
        blocks = [
            maxsim_unchecked(Q, D, q_mask, mask, normalize=self.normalize)
            for _, D, mask in self._chunks()
        ]
        out = torch.cat(blocks, dim=1)
        return out[0] if squeeze else out

    @torch.no_grad()
    def topk(
        self, Q: torch.Tensor, k: int, q_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` best documents per query: ``(scores float32, indices int64)``, each
        ``(Nq, min(k, Nd))``, best first (``(min(k, Nd),)`` for a single ``(Lq, d)`` query).

        ``k`` is clamped to the number of documents, as in :func:`retrieve` and the sharded
        indexes; it must be a positive int.
        """
        Q, q_mask, squeeze = self._check(Q, q_mask)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        k = min(k, len(self))
        best_scores = best_ids = None
        for start, D, mask in self._chunks():
            block = maxsim_unchecked(Q, D, q_mask, mask, normalize=self.normalize)
            ids = torch.arange(start, start + block.shape[1], device=block.device).expand_as(block)
            if best_scores is not None:
                block = torch.cat([best_scores, block], dim=1)
                ids = torch.cat([best_ids, ids], dim=1)
            take = min(k, block.shape[1])
            best_scores, where = block.topk(take, dim=1)
            best_ids = ids.gather(1, where)
        return (best_scores[0], best_ids[0]) if squeeze else (best_scores, best_ids)
