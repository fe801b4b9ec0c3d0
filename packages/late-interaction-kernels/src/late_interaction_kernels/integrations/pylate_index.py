"""A PyLate index backed by :class:`~late_interaction_kernels.CompressedMaxSimIndex`: PyLate's index
interface (``add_documents``, ``remove_documents``, ``__call__``, ``get_documents_embeddings``), an
end-to-end index as PLAID is, so ``pylate.retrieve.ColBERT(index=...)`` takes it in place of
``indexes.PLAID(...)``:

.. code-block:: python

    from late_interaction_kernels.integrations.pylate_index import CompressedIndex
    index = CompressedIndex(index_folder="indexes", index_name="msmarco", override=True)
    index.add_documents(documents_ids=ids, documents_embeddings=embeddings)
    retriever = retrieve.ColBERT(index=index)

PyLate is not imported: the class follows its interface and returns its result dicts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import torch

from ..ops.compressed import CompressedMaxSimIndex

INDEX_FILE = "index.pt"
IDS_FILE = "documents_ids.json"


def _as_tensors(embeddings) -> list[torch.Tensor]:
    if isinstance(embeddings, torch.Tensor) and embeddings.dim() == 2:
        embeddings = [embeddings]
    out = []
    for i, e in enumerate(embeddings):
        t = torch.as_tensor(e)
        if t.dim() != 2:
            raise ValueError(f"embeddings[{i}] must be a (tokens, dim) array, got shape {tuple(t.shape)}")
        out.append(t.float())
    return out


class CompressedIndex:
    """PyLate index of string document ids over a :class:`CompressedMaxSimIndex`.

    Args:
        index_folder, index_name: where :meth:`save` writes (``index_folder/index_name/``); an
            existing index there is loaded unless ``override=True``.
        override: start empty even if an index exists on disk.
        device: where the index lives (default: CUDA when available).
        n_probe, n_candidates, n_rerank: search settings (see
            :meth:`CompressedMaxSimIndex.search`).
        **build_options: passed to :meth:`CompressedMaxSimIndex.build` at the first
            :meth:`add_documents` (``nbits``, ``n_centroids``, ``keep_full``, ...).

    The centroids are trained on the first batch of documents; later batches are compressed with
    them (as PLAID's updates do). Documents are saved after every change.
    """

    is_end_to_end_index = True

    def __init__(
        self,
        index_folder: str = "indexes",
        index_name: str = "compressed",
        override: bool = False,
        *,
        device: str | torch.device | None = None,
        n_probe: int = 4,
        n_candidates: int = 512,
        n_rerank: int | None = None,
        **build_options: Any,
    ) -> None:
        self.folder = os.path.join(index_folder, index_name)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.search_options = {"n_probe": n_probe, "n_candidates": n_candidates, "n_rerank": n_rerank}
        self.build_options = build_options
        self.index: CompressedMaxSimIndex | None = None
        self.ids: list[str | None] = []  # position -> document id (None: removed)
        self.positions: dict[str, int] = {}
        path = os.path.join(self.folder, INDEX_FILE)
        if not override and os.path.exists(path):
            self.index = CompressedMaxSimIndex.load(path, device=self.device)
            with open(os.path.join(self.folder, IDS_FILE)) as f:
                self.ids = json.load(f)
            self.positions = {d: i for i, d in enumerate(self.ids) if d is not None}

    def __len__(self) -> int:
        return len(self.positions)

    def add_documents(
        self,
        documents_ids: str | Sequence[str],
        documents_embeddings,
        batch_size: int | None = None,
        **_: Any,
    ) -> CompressedIndex:
        """Add (or replace, for ids already present) documents; returns the index."""
        ids = [documents_ids] if isinstance(documents_ids, str) else list(documents_ids)
        docs = _as_tensors(documents_embeddings)
        if len(ids) != len(docs):
            raise ValueError(f"{len(ids)} documents_ids for {len(docs)} documents_embeddings")
        if len(set(ids)) != len(ids):
            raise ValueError("documents_ids holds the same id twice")
        replaced = [i for i in ids if i in self.positions]
        if replaced:
            self.remove_documents(replaced, save=False)
        if self.index is None:
            self.index = CompressedMaxSimIndex.build(docs, device=self.device, **self.build_options)
            first = 0
        else:
            first = int(self.index.add(docs)[0])
        for offset, doc_id in enumerate(ids):
            self.ids.append(doc_id)
            self.positions[doc_id] = first + offset
        self.save()
        return self

    def remove_documents(self, documents_ids: Sequence[str], save: bool = True) -> CompressedIndex:
        """Delete documents by id (unknown ids raise ``KeyError``)."""
        missing = [d for d in documents_ids if d not in self.positions]
        if missing:
            raise KeyError(f"documents not in the index: {missing[:5]}")
        if self.index is not None and documents_ids:
            self.index.delete([self.positions.pop(d) for d in documents_ids])
            self.ids = [d if d in self.positions else None for d in self.ids]
        if save:
            self.save()
        return self

    def __call__(self, queries_embeddings, k: int = 10, subset=None) -> list[list[dict]]:
        """PyLate's results: per query a list of ``{"id": document id, "score": float}``, best
        first, at most ``k`` (and at most the documents held)."""
        if self.index is None or len(self.index) == 0:
            raise ValueError("the index is empty: add documents before querying")
        if subset is not None:
            raise NotImplementedError("subset= is not supported by CompressedIndex")
        queries = _as_tensors(queries_embeddings)
        width = max(q.shape[0] for q in queries)
        Q = torch.zeros(len(queries), width, queries[0].shape[1])
        mask = torch.zeros(len(queries), width, dtype=torch.bool)
        for i, q in enumerate(queries):
            Q[i, : q.shape[0]] = q
            mask[i, : q.shape[0]] = True
        k = min(k, len(self.index))
        scores, positions = self.index.search(Q, k, mask, **self.search_options)
        out = []
        for row_s, row_p in zip(scores.tolist(), positions.tolist()):
            out.append([{"id": self.ids[p], "score": s} for s, p in zip(row_s, row_p) if p >= 0])
        return out

    def get_documents_embeddings(self, documents_ids: Sequence[Sequence[str]]) -> list[list[torch.Tensor]]:
        """The stored tokens (decompressed, or the kept full tokens) of each id."""
        return [[self.index.document_tokens(self.positions[d]).cpu() for d in row] for row in documents_ids]

    def save(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        if self.index is not None:
            self.index.save(os.path.join(self.folder, INDEX_FILE))
        with open(os.path.join(self.folder, IDS_FILE), "w") as f:
            json.dump(self.ids, f)
