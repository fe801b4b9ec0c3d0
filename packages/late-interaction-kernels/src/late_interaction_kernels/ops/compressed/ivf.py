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


def distinct_probes(probes: torch.Tensor) -> torch.Tensor:
    """``probes`` sorted along each row with every repeat of a centroid set to -1 (a centroid
    probed by several query tokens is read once)."""
    ordered = probes.sort(dim=1).values
    repeat = torch.zeros_like(ordered, dtype=torch.bool)
    repeat[:, 1:] = ordered[:, 1:] == ordered[:, :-1]
    return ordered.masked_fill(repeat, -1)


def candidates(probes: torch.Tensor, list_offsets, list_docs, n_docs: int):
    """``(pair_query int32, pair_doc int32)`` sorted by query then document: for every query ``i``
    the documents of the lists of ``probes[i]`` (centroid ids; negative entries probe nothing),
    each once. Two host synchronisations: the size of the gathered lists and of the unique pairs."""
    width = probes.shape[1]
    ordered = distinct_probes(probes)
    centroid = ordered.clamp_min(0).reshape(-1)
    start = list_offsets[centroid]
    length = torch.where((ordered >= 0).reshape(-1), list_offsets[centroid + 1] - start, 0)
    total = int(length.sum())
    owner = torch.repeat_interleave(torch.arange(length.shape[0], device=probes.device), length,
                                    output_size=total)  # fmt: skip
    pos = torch.arange(total, device=probes.device) - (torch.cumsum(length, 0) - length)[owner]
    docs = list_docs[start[owner] + pos].long()
    key = torch.unique(owner // width * n_docs + docs)
    return (key // n_docs).to(torch.int32), (key % n_docs).to(torch.int32)
