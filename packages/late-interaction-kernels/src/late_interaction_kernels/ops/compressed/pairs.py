"""The pair scorers of the compressed index: one float32 score per ``(query, document)`` pair, by
the kernels of :mod:`.kernels` (CUDA or the interpreter) or in PyTorch (chunks of pairs, padded),
whose results match :mod:`.reference`.

These are internal: the index validates its own layout once when it is built or loaded, and
every call here receives tensors it made. Queries arrive with masked tokens zeroed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from triton_dispatch import next_power_of_2, padded_dim, select_backend, uses_triton

from .ivf import candidates
from .reference import unpack_buckets

#: Pairs scored at a time on the PyTorch path (bounds its padded ``(pairs, max_len, d)`` block).
TORCH_PAIRS = 512


@dataclass
class Codec:
    """A collection's compressed tokens (the layout of :mod:`.reference`)."""

    codes: torch.Tensor
    residuals: torch.Tensor
    centroids: torch.Tensor
    bucket_weights: torch.Tensor
    nbits: int

    def decompress(self, rows: torch.Tensor) -> torch.Tensor:
        """float32 tokens of the given rows."""
        d = self.centroids.shape[1]
        buckets = unpack_buckets(self.residuals[rows], self.nbits, d)
        w = self.bucket_weights.float().gather(1, buckets.T).T if rows.numel() else buckets.float()
        return self.centroids.float()[self.codes[rows].long()] + w


def _kernel_backend(t: torch.Tensor, backend: str | None) -> str | None:
    chosen = select_backend(t, backend=backend)
    return chosen if uses_triton(chosen) else None


def _output(out: torch.Tensor | None, pair_query: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty(pair_query.shape[0], dtype=torch.float32, device=pair_query.device)
    return out


def _empty_pairs(pair_query: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.float32, device=pair_query.device)


def _padded_docs(pair_doc, doc_offsets, fetch):
    """``(tokens (P, L, d) float32, valid (P, L))`` of the pairs' documents, ``L`` the longest."""
    lo = doc_offsets[pair_doc]
    n = doc_offsets[pair_doc + 1] - lo
    width = max(int(n.max()) if n.numel() else 0, 1)
    j = torch.arange(width, device=pair_doc.device)
    valid = j[None, :] < n[:, None]
    rows = torch.where(valid, lo[:, None] + j[None, :], torch.zeros_like(lo)[:, None])
    return fetch(rows.reshape(-1)).reshape(*rows.shape, -1), valid


def _torch_maxsim(Q, pair_query, pair_doc, doc_offsets, fetch) -> torch.Tensor:
    out = torch.empty(pair_query.shape[0], dtype=torch.float32, device=Q.device)
    for s in range(0, pair_query.shape[0], TORCH_PAIRS):
        pq, pd = pair_query[s : s + TORCH_PAIRS].long(), pair_doc[s : s + TORCH_PAIRS].long()
        docs, valid = _padded_docs(pd, doc_offsets, fetch)
        sim = torch.einsum("ptd,pjd->ptj", Q[pq].float(), docs)
        best = sim.masked_fill(~valid[:, None, :], float("-inf")).max(2).values
        out[s : s + TORCH_PAIRS] = torch.where(valid.any(1)[:, None], best, 0.0).sum(1)
    return out


def pair_maxsim(
    Q: torch.Tensor,
    pair_query: torch.Tensor,
    pair_doc: torch.Tensor,
    doc_offsets: torch.Tensor,
    *,
    tokens: torch.Tensor | None = None,
    codec: Codec | None = None,
    max_len: int,
    backend: str | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """MaxSim of ``Q[pair_query[p]]`` against document ``pair_doc[p]`` of ``tokens`` (stored) or of
    ``codec`` (decompressed in registers): float32 ``(P,)``, written into ``out`` when given."""
    if pair_query.numel() == 0:
        return _empty_pairs(pair_query)
    chosen = _kernel_backend(Q, backend)
    if chosen is None:
        fetch = (lambda rows: tokens[rows].float()) if codec is None else codec.decompress
        return _output(out, pair_query).copy_(_torch_maxsim(Q, pair_query, pair_doc, doc_offsets, fetch))
    from .kernels import pair_maxsim_kernel

    interpret = chosen == "interpret"
    _nq, lq, dim = Q.shape
    out = _output(out, pair_query)
    dummy = out
    if codec is not None:
        args = (dummy, codec.codes, codec.residuals, codec.centroids, codec.bucket_weights)
        width, nbits = codec.residuals.shape[1], codec.nbits
    else:
        args = (tokens, dummy, dummy, dummy, dummy)
        width, nbits = 0, 1
    # the interpreter's bf16 dot is wrong: fp32 there; on the GPU the query's dtype
    block_q = min(max(16, next_power_of_2(lq)), 64)
    pair_maxsim_kernel[(pair_query.shape[0],)](
        Q, pair_query, pair_doc, doc_offsets, *args, out, lq, dim, width, max_len,
        COMPRESSED=codec is not None, NBITS=nbits, PER_BYTE=8 // nbits,
        UPCAST=interpret or Q.dtype == torch.float32, DYNAMIC_BOUNDS=not interpret,
        IEEE=Q.dtype == torch.float32 and not interpret,
        BLOCK_Q=block_q, BLOCK_T=32 if interpret else 64, BLOCK_D=padded_dim(dim),
        num_warps=4, num_stages=2 if not interpret else 1,
    )  # fmt: skip
    return out


def centroid_pair_scores(
    query_centroid_scores: torch.Tensor,
    pair_query: torch.Tensor,
    pair_doc: torch.Tensor,
    codes: torch.Tensor,
    doc_offsets: torch.Tensor,
    *,
    max_len: int,
    backend: str | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The candidate score of every pair from ``query_centroid_scores (Nq, K, Lq)``: float32 ``(P,)``
    (see :func:`.reference.centroid_pair_scores_reference`)."""
    if pair_query.numel() == 0:
        return _empty_pairs(pair_query)
    qcs = query_centroid_scores
    chosen = _kernel_backend(qcs, backend)
    if chosen is None:
        out = _output(out, pair_query)
        for s in range(0, pair_query.shape[0], TORCH_PAIRS):
            pq, pd = pair_query[s : s + TORCH_PAIRS].long(), pair_doc[s : s + TORCH_PAIRS].long()
            rows, valid = _padded_docs(pd, doc_offsets, lambda r: codes[r].long()[:, None])
            gathered = qcs[pq[:, None], rows[..., 0]].float()  # (P, L, Lq)
            best = gathered.masked_fill(~valid[..., None], float("-inf")).max(1).values
            out[s : s + TORCH_PAIRS] = torch.where(valid.any(1)[:, None], best, 0.0).sum(1)
        return out
    from .kernels import centroid_pair_kernel

    interpret = chosen == "interpret"
    _nq, n_centroids, lq = qcs.shape
    out = _output(out, pair_query)
    centroid_pair_kernel[(pair_query.shape[0],)](
        qcs, pair_query, pair_doc, codes, doc_offsets, out, n_centroids, lq, max_len,
        DYNAMIC_BOUNDS=not interpret, BLOCK_L=32 if interpret else 64,
        BLOCK_Q=min(max(16, next_power_of_2(lq)), 64), num_warps=4,
    )  # fmt: skip
    return out


#: Grid limit of the probed lists' third axis (CUDA's 65,535): longer lists take more per program.
_MAX_LIST_PROGRAMS = 65_535
#: Documents of an inverted list scored by one program (at least).
LIST_DOCS_PER_PROGRAM = 8


def probed_centroid_scores(
    query_centroid_scores: torch.Tensor,
    probes: torch.Tensor,
    list_offsets: torch.Tensor,
    list_docs: torch.Tensor,
    codes: torch.Tensor,
    doc_offsets: torch.Tensor,
    *,
    n_docs: int,
    max_len: int,
    max_list: int,
    backend: str | None = None,
) -> torch.Tensor:
    """Dense float32 ``(Nq, n_docs)``: the candidate score of every document on the inverted lists
    of query ``i``'s ``probes[i]`` (centroid ids, each at most once per row; negative: none),
    ``-inf`` for the others. ``max_list``: the longest list's length. Nothing is read back to the
    host, so a small batch runs without a synchronisation."""
    qcs = query_centroid_scores
    nq, n_probes = probes.shape
    out = torch.full((nq, n_docs), float("-inf"), dtype=torch.float32, device=qcs.device)
    chosen = _kernel_backend(qcs, backend)
    if chosen is None:
        pair_query, pair_doc = candidates(probes, list_offsets, list_docs, n_docs)
        scores = centroid_pair_scores(qcs, pair_query, pair_doc, codes, doc_offsets,
                                      max_len=max_len, backend=backend)  # fmt: skip
        out[pair_query.long(), pair_doc.long()] = scores
        return out
    if nq == 0 or n_probes == 0 or max_list == 0:
        return out
    from .kernels import probed_lists_kernel

    interpret = chosen == "interpret"
    _nq, n_centroids, lq = qcs.shape
    per_program = max(LIST_DOCS_PER_PROGRAM, -(-max_list // _MAX_LIST_PROGRAMS))
    grid = (nq, n_probes, -(-max_list // per_program))
    probed_lists_kernel[grid](
        qcs, probes.contiguous(), list_offsets, list_docs, codes, doc_offsets, out,
        n_probes, n_centroids, n_docs, lq, max_len, per_program,
        DYNAMIC_BOUNDS=not interpret, BLOCK_L=32 if interpret else 64,
        BLOCK_Q=min(max(16, next_power_of_2(lq)), 64), num_warps=4,
    )  # fmt: skip
    return out


__all__ = ["Codec", "centroid_pair_scores", "pair_maxsim", "probed_centroid_scores"]
