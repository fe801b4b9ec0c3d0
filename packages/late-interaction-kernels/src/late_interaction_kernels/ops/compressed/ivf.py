"""The inverted lists of the compressed index (for every centroid, the documents holding a token
assigned to it) and candidate generation from them: each query's documents reachable from the
centroids its tokens probe, as sorted ``(query, document)`` pairs."""

from __future__ import annotations

import torch


def document_of_tokens(doc_offsets: torch.Tensor) -> torch.Tensor:
    """int64 ``(T,)``: the document of every token."""
    lengths = doc_offsets[1:] - doc_offsets[:-1]
    return torch.repeat_interleave(torch.arange(lengths.shape[0], device=lengths.device), lengths)


def build_lists(codes: torch.Tensor, doc_offsets: torch.Tensor, n_centroids: int):
    """``(list_offsets int64 (K + 1,), list_docs int32 (E,))``: centroid ``c``'s documents, each
    once and in increasing order, are ``list_docs[list_offsets[c]:list_offsets[c + 1]]``."""
    n_docs = doc_offsets.shape[0] - 1
    key = torch.unique(codes.long() * max(n_docs, 1) + document_of_tokens(doc_offsets))
    counts = torch.bincount(key // max(n_docs, 1), minlength=n_centroids)
    offsets = torch.zeros(n_centroids + 1, dtype=torch.int64, device=codes.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return offsets, (key % max(n_docs, 1)).to(torch.int32)


def candidates(probes: torch.Tensor, list_offsets, list_docs, live: torch.Tensor | None):
    """``(pair_query int32, pair_doc int32)`` sorted by query then document: for every query ``i``
    the live documents of the lists of ``probes[i]`` (centroid ids; negative entries probe
    nothing)."""
    nq, width = probes.shape
    n_docs = live.shape[0] if live is not None else int(list_docs.max()) + 1 if list_docs.numel() else 1
    n_centroids = list_offsets.shape[0] - 1
    query = torch.arange(nq, device=probes.device).repeat_interleave(width)
    flat = probes.reshape(-1).long()
    ok = flat >= 0
    pair = torch.unique(query[ok] * n_centroids + flat[ok])
    q_of, c_of = pair // n_centroids, pair % n_centroids
    start = list_offsets[c_of]
    length = list_offsets[c_of + 1] - start
    owner = torch.repeat_interleave(torch.arange(length.shape[0], device=probes.device), length)
    first = torch.cumsum(length, 0) - length
    pos = torch.arange(owner.shape[0], device=probes.device) - first[owner]
    docs = list_docs[start[owner] + pos].long()
    key = torch.unique(q_of[owner] * n_docs + docs)
    pair_query, pair_doc = key // n_docs, key % n_docs
    if live is not None:
        keep = live[pair_doc]
        pair_query, pair_doc = pair_query[keep], pair_doc[keep]
    return pair_query.to(torch.int32), pair_doc.to(torch.int32)
