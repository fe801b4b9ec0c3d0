""":class:`CompressedMaxSimIndex`: a collection held as centroid codes and packed residual buckets,
searched by probing inverted lists, scoring candidates by their centroids, then by their
decompressed tokens, then (optionally) by their stored tokens."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Literal

import torch

from ..retrieve.index import read_index_file
from ..retrieve.validation import describe
from . import codec, ivf
from .pairs import Codec, centroid_pair_scores, pair_maxsim, probed_centroid_scores

#: Queries times documents up to which a batch takes its candidates from dense score rows
#: (float32, 128 MiB at most) instead of sorted pairs: the single-query and small-batch path.
DENSE_CELLS = 1 << 25
#: What :meth:`CompressedMaxSimIndex.save` writes under ``"format"``.
FORMAT = "late_interaction_kernels.CompressedMaxSimIndex/1"
#: Bytes of ``centroids @ Q.T`` scores held at once during a search (sets the query chunk).
SCORE_BLOCK_BYTES = 1 << 29
#: Tokens encoded per step of a build or an add.
ENCODE_CHUNK = 1 << 20
NBITS = (1, 2, 4, 8)

KeepFull = Literal["device", "host"]


def _int_option(name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def _packed(documents, lengths) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens (T, d), lengths int64 (N,))`` of a list of ``(L_i, d)`` documents or of packed
    ``tokens`` with ``lengths``; every document must hold a token."""
    if isinstance(documents, torch.Tensor):
        if lengths is None:
            raise ValueError(
                "documents given as one tensor must be packed tokens (T, d) with lengths (N,); "
                "pass a list of (L, d) tensors otherwise"
            )
        if documents.dim() != 2:
            raise ValueError(f"documents must be packed tokens (T, d), got {describe(documents)}")
        if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1 or lengths.is_floating_point():
            raise ValueError(f"lengths must be an integer tensor (N,), got {describe(lengths)}")
        lengths = lengths.to(torch.int64).cpu()
        if int(lengths.sum()) != documents.shape[0]:
            raise ValueError(
                f"lengths add up to {int(lengths.sum())} tokens but documents holds {documents.shape[0]}"
            )
        tokens = documents
    else:
        if lengths is not None:
            raise ValueError("lengths is only accepted with packed tokens (a (T, d) tensor)")
        docs = list(documents)
        for i, doc in enumerate(docs):
            if not isinstance(doc, torch.Tensor) or doc.dim() != 2:
                raise ValueError(f"documents[{i}] must be an (L, d) tensor, got {describe(doc)}")
        if any(doc.shape[1] != docs[0].shape[1] for doc in docs):
            raise ValueError("every document must have the same embedding width d")
        lengths = torch.tensor([doc.shape[0] for doc in docs], dtype=torch.int64)
        tokens = torch.cat(docs) if docs else torch.empty(0, 0)
    if lengths.numel() == 0:
        raise ValueError("documents is empty: an index needs at least one document")
    if not tokens.is_floating_point():
        raise TypeError(f"documents must be floating-point tokens, got {tokens.dtype}")
    empty = (lengths <= 0).nonzero()
    if empty.numel():
        raise ValueError(
            f"documents[{int(empty[0])}] has no tokens: every document needs at least one token"
        )
    return tokens, lengths


class CompressedMaxSimIndex:
    """A late-interaction collection compressed for search at scale (PLAID-style residual codes).

    Each token is stored as its nearest k-means centroid (int32) and ``nbits`` bits per dimension
    of residual (``d * nbits / 8`` bytes: 64 bytes a 128-dim token at 4 bits, a quarter of bf16).
    A search probes, for every query token, the ``n_probe`` centroids nearest to it; every live
    document holding a token of a probed centroid is a candidate. Candidates are scored by MaxSim
    against their tokens' centroids, the best ``n_candidates`` by MaxSim against their tokens
    decompressed in registers, and, when the full tokens are kept (``keep_full``), the best
    ``n_rerank`` of those exactly. Every score is computed by a Triton kernel that writes one
    value per (query, document) pair.

    Build it with :meth:`build`; :meth:`add` and :meth:`delete` change it without a rebuild;
    :meth:`save` / :meth:`load` keep it on disk. Ids are positions in the order documents were
    added and stay valid after deletions.

    Example:
        >>> index = CompressedMaxSimIndex.build(doc_embeddings, device="cuda")
        >>> scores, ids = index.search(query_embeddings, k=10)
    """

    def __init__(self, state: dict) -> None:
        # private: use build() or load()
        self.__dict__.update(state)
        self._codec = Codec(self.codes, self.residuals, self.centroids, self.bucket_weights, self.nbits)
        self._live_count = int(self.live.sum())
        self._max_list = _longest_list(self.list_offsets)

    # ----------------------------------------------------------------------------- building
    @classmethod
    def build(
        cls,
        documents: Sequence[torch.Tensor] | torch.Tensor,
        lengths: torch.Tensor | None = None,
        *,
        nbits: int = 2,
        n_centroids: int | None = None,
        kmeans_iters: int = 4,
        kmeans_points_per_centroid: int = 64,
        keep_full: KeepFull | None = "host",
        reserve: float = 0.1,
        normalize: bool = False,
        device: torch.device | str | None = None,
        seed: int = 0,
    ) -> CompressedMaxSimIndex:
        """Compress a collection.

        Args:
            documents: a list of ``(L_i, d)`` tensors, or packed tokens ``(T, d)`` with
                ``lengths``. Every document needs at least one token; tokens must be finite.
            lengths: int ``(N,)`` tokens per document, with packed ``documents``.
            nbits: residual bits per dimension: 1, 2, 4 or 8 (``d * nbits`` a multiple of 8).
                With the exact rerank 2 bits keep recall@10 at 0.998-1.0 (BENCHMARKS.md); 4 bits
                rank better without it.
            n_centroids: k-means centroids (default: PLAID's ``2 ** floor(log2(16 sqrt(T)))``).
            kmeans_iters, kmeans_points_per_centroid: k-means steps, and the sample size per
                centroid it trains on.
            keep_full: keep the tokens (fp16 on CUDA) for the exact rerank: in pinned ``"host"``
                memory (the default: the GPU reads the few it needs over the bus; 256 bytes a
                128-dim token of host memory), on the index's ``"device"``, or ``None`` (only
                the codes: no rerank, scores from the decompressed tokens).
            reserve: room kept for later :meth:`add` calls in the kept tokens' store, as a share
                of the collection's tokens (0.1: an add of up to a tenth more copies only the new
                tokens; past it the store grows by a quarter, a copy of every kept token).
                Pinning host memory is what a build spends most time on after k-means, so an add
                that had to re-pin the whole store would cost as much as a build.
            normalize: L2-normalise documents (here) and queries (at search) first.
            device: where the index lives and is built (default: the documents' device).
            seed: the k-means sample and initialisation.
        """
        if nbits not in NBITS or isinstance(nbits, bool):
            raise ValueError(f"nbits must be one of {NBITS}, got {nbits!r}")
        if keep_full not in (None, "device", "host"):
            raise ValueError(f"keep_full must be None, 'device' or 'host', got {keep_full!r}")
        _int_option("kmeans_iters", kmeans_iters, 0)
        _int_option("kmeans_points_per_centroid", kmeans_points_per_centroid)
        if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or not 0 <= reserve <= 10:
            raise ValueError(f"reserve must be a number in [0, 10] (a share of the tokens), got {reserve!r}")
        tokens, lengths = _packed(documents, lengths)
        n_tok, dim = tokens.shape
        if dim == 0 or (dim * nbits) % 8:
            raise ValueError(f"the token width d={dim} times nbits={nbits} must be a positive multiple of 8")
        k = codec.default_centroids(n_tok) if n_centroids is None else n_centroids
        _int_option("n_centroids", k)
        if k > n_tok:
            raise ValueError(f"n_centroids={k} exceeds the collection's {n_tok} tokens")
        device = torch.device(device) if device is not None else tokens.device
        dtype = torch.float16 if device.type == "cuda" else torch.float32

        gen = torch.Generator(device="cpu").manual_seed(seed)
        n_sample = min(n_tok, kmeans_points_per_centroid * k)
        rows = torch.randperm(n_tok, generator=gen)[:n_sample].sort().values
        doc_offsets = torch.zeros(lengths.shape[0] + 1, dtype=torch.int64)
        doc_offsets[1:] = torch.cumsum(lengths, 0)
        try:
            sample = _prepare_tokens(tokens[rows.to(tokens.device)], device, dtype, normalize)
        except ValueError:
            _raise_nonfinite(tokens, doc_offsets, 0, 0)
        centroids, cutoffs, weights = codec.train(
            sample, k, nbits, iters=kmeans_iters, seed=seed, spherical=normalize
        )
        del sample
        state = {
            "dim": dim, "nbits": nbits, "normalize": normalize, "keep_full": keep_full,
            "centroids": centroids.to(dtype), "cutoffs": cutoffs, "bucket_weights": weights,
            "doc_offsets": doc_offsets.to(device),
            "live": torch.ones(lengths.shape[0], dtype=torch.bool, device=device),
        }  # fmt: skip
        store = _new_store(n_tok + math.ceil(reserve * n_tok), dim, keep_full, device, dtype)
        state.update(_encode_all(tokens, state, device, dtype, first_doc=0, offsets=doc_offsets,
                                 store=store))  # fmt: skip
        state["_full_store"] = store
        state["full"] = None if store is None else store[:n_tok]
        if keep_full == "host":
            state["host_offsets"] = doc_offsets.clone()
        state["max_len"] = int(lengths.max())
        state["list_offsets"], state["list_docs"] = ivf.build_lists(
            state["codes"], state["doc_offsets"], k
        )
        return cls(state)

    # ------------------------------------------------------------------------------ queries
    def __len__(self) -> int:
        """Live documents (deleted ones are not counted)."""
        return self._live_count

    @property
    def n_slots(self) -> int:
        """Documents ever added (ids run over ``range(n_slots)``)."""
        return self.doc_offsets.shape[0] - 1

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def nbytes(self) -> int:
        """Bytes the index holds on its device (the full tokens too when kept there)."""
        held = [self.codes, self.residuals, self.centroids, self.bucket_weights, self.cutoffs,
                self.doc_offsets, self.live, self.list_offsets, self.list_docs]  # fmt: skip
        if self.full is not None and self.full.device == self.device:
            held.append(self._full_store)  # with the room kept for adds
        return sum(t.numel() * t.element_size() for t in held)

    @torch.no_grad()
    def search(
        self,
        Q: torch.Tensor,
        k: int,
        q_mask: torch.Tensor | None = None,
        *,
        n_probe: int = 4,
        n_candidates: int = 512,
        n_rerank: int | None = None,
        backend: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` best documents per query: ``(scores float32, ids int64)``, each
        ``(Nq, min(k, live documents))``, best first (``(min(k, live),)`` for a 2-D ``Q``).

        Args:
            Q: ``(Nq, Lq, d)`` or ``(Lq, d)`` query tokens.
            k: results per query, a positive int, clamped to the live documents (as
                :meth:`MaxSimIndex.topk` and :func:`retrieve`).
            q_mask: bool ``(Nq, Lq)``, True = a real token (masked tokens add 0 and probe nothing).
            n_probe: centroids probed per query token.
            n_candidates: candidates per query kept after the centroid score and scored on their
                decompressed tokens (the whole collection is a candidate when it holds no more).
            n_rerank: with ``keep_full``, the best this many (by the decompressed score) are scored
                on their stored tokens (default ``max(4 k, 32)``, at least ``k``); 0 turns the
                rerank off.
            backend: ``"triton"``, ``"interpret"`` or ``"torch"`` (default: by device).

        Scores are exact MaxSim for reranked results and the decompressed tokens' MaxSim
        otherwise. A query whose candidates number fewer than ``k`` fills its row with id -1 and
        score -inf.
        """
        squeeze = isinstance(Q, torch.Tensor) and Q.dim() == 2
        if squeeze:
            Q = Q.unsqueeze(0)
            q_mask = q_mask.unsqueeze(0) if isinstance(q_mask, torch.Tensor) else q_mask
        self._check_queries(Q, q_mask)
        k = _int_option("k", k)
        if len(self) == 0:
            raise ValueError("the index holds no live documents: add documents before searching")
        k = min(k, len(self))  # as MaxSimIndex.topk, retrieve and the sharded indexes
        n_probe = min(_int_option("n_probe", n_probe), self.centroids.shape[0])
        n_candidates = max(_int_option("n_candidates", n_candidates), k)
        if n_rerank is None:
            n_rerank = max(4 * k, 32) if self.full is not None else 0
        n_rerank = _int_option("n_rerank", n_rerank, 0) if self.full is not None else 0
        n_rerank = max(n_rerank, k) if n_rerank else 0  # the rerank returns all k
        Qc, valid = self._prepare_queries(Q, q_mask)
        nq, lq = Qc.shape[:2]
        per_chunk = max(1, SCORE_BLOCK_BYTES // max(1, self.centroids.shape[0] * lq * Qc.element_size()))
        scores, ids = [], []
        for s in range(0, nq, per_chunk):
            out = self._search_chunk(Qc[s : s + per_chunk], valid[s : s + per_chunk], k, n_probe,
                                     n_candidates, n_rerank, backend)  # fmt: skip
            scores.append(out[0])
            ids.append(out[1])
        scores, ids = torch.cat(scores), torch.cat(ids)
        return (scores[0], ids[0]) if squeeze else (scores, ids)

    def _check_queries(self, Q, q_mask) -> None:
        if not isinstance(Q, torch.Tensor) or Q.dim() != 3 or not Q.is_floating_point():
            raise ValueError(f"Q must be a floating-point (Nq, Lq, d) or (Lq, d) tensor, got {describe(Q)}")
        if Q.shape[-1] != self.dim:
            raise ValueError(f"Q has embedding width {Q.shape[-1]}, the index holds d={self.dim}")
        if q_mask is not None and (
            not isinstance(q_mask, torch.Tensor) or q_mask.dtype != torch.bool
            or tuple(q_mask.shape) != tuple(Q.shape[:2])
        ):  # fmt: skip
            raise ValueError(f"q_mask must be a bool tensor of shape {tuple(Q.shape[:2])}, got {describe(q_mask)}")

    def _prepare_queries(self, Q, q_mask):
        Qc = Q.to(self.device)
        if self.normalize:
            Qc = torch.nn.functional.normalize(Qc.float(), dim=-1)
        valid = (
            torch.ones(Q.shape[:2], dtype=torch.bool, device=self.device)
            if q_mask is None
            else q_mask.to(self.device)
        )
        Qc = torch.where(valid[..., None], Qc, 0).to(self.centroids.dtype).contiguous()
        return Qc, valid

    def _search_chunk(self, Qc, valid, k, n_probe, n_candidates, n_rerank, backend):
        nq = Qc.shape[0]
        qcs = torch.matmul(self.centroids, Qc.transpose(1, 2)).contiguous()  # (nq, K, Lq)
        if self.n_slots <= n_candidates:  # every document is a candidate
            pair_query = torch.arange(nq, device=self.device, dtype=torch.int32).repeat_interleave(self.n_slots)
            pair_doc = torch.arange(self.n_slots, device=self.device, dtype=torch.int32).repeat(nq)
        else:
            probes = qcs.topk(n_probe, dim=1).indices  # (nq, n_probe, Lq)
            probes = probes.masked_fill(~valid[:, None, :], -1).reshape(nq, -1)
            if nq * self.n_slots <= DENSE_CELLS:
                return self._search_dense(Qc, qcs, probes, k, n_candidates, n_rerank, backend)
            pair_query, pair_doc = ivf.candidates(probes, self.list_offsets, self.list_docs, self.n_slots)
        approx = centroid_pair_scores(qcs, pair_query, pair_doc, self.codes, self.doc_offsets,
                                      max_len=self.max_len, backend=backend)  # fmt: skip
        del qcs
        # deleted documents never pass: -inf drops them below every real candidate
        approx = torch.where(self.live[pair_doc.long()], approx, float("-inf"))
        # a non-finite query (NaN, inf) shows in its centroid scores: checked with the one read
        # of the candidates' count this stage needs anyway
        cand = _best_per_query(approx, pair_query, pair_doc, nq, n_candidates,
                               also_read=~torch.isfinite(Qc).all())  # fmt: skip
        return self._rescore(Qc, cand, k, n_rerank, backend)

    def _search_dense(self, Qc, qcs, probes, k, n_candidates, n_rerank, backend):
        """A small batch: every probed document's candidate score lands in a dense row per query
        and the candidates are its top ``n_candidates``: no candidate count crosses to the host,
        and the one synchronisation is the non-finite-query check at the end."""
        approx = probed_centroid_scores(
            qcs, ivf.distinct_probes(probes), self.list_offsets, self.list_docs, self.codes,
            self.doc_offsets, n_docs=self.n_slots, max_len=self.max_len, max_list=self._max_list,
            backend=backend,
        )  # fmt: skip
        bad = ~torch.isfinite(Qc).all()
        approx = torch.where(self.live, approx, float("-inf"))  # deleted documents never pass
        ids = torch.arange(self.n_slots, device=self.device).expand_as(approx)
        out = self._rescore(Qc, _take(approx, ids, n_candidates), k, n_rerank, backend)
        if bool(bad):
            raise ValueError("Q holds NaN or infinite values")
        return out

    def _rescore(self, Qc, cand, k, n_rerank, backend):
        """The decompressed score of the candidates ``cand`` (-1: none), the exact rerank of the
        best ``n_rerank``, and the top ``k``: ``(scores float32, ids int64)``."""
        scores = self._score(Qc, cand, codec=self._codec, backend=backend)
        if n_rerank:
            cand = _take(scores, cand, n_rerank)
            scores = self._score(Qc, cand, codec=None, backend=backend)
        top = scores.topk(min(k, scores.shape[1]), dim=1)
        ids = torch.where(torch.isfinite(top.values), cand.gather(1, top.indices), -1)
        scores = top.values
        if scores.shape[1] < k:  # fewer candidates than k
            pad = k - scores.shape[1]
            scores = torch.nn.functional.pad(scores, (0, pad), value=float("-inf"))
            ids = torch.nn.functional.pad(ids, (0, pad), value=-1)
        return scores.float(), ids.long()

    def _score(self, Qc, cand, *, codec, backend):
        """Scores ``(nq, width)`` of the candidate ids ``cand`` (-1: none, scored -inf). Every
        slot is scored (a missing one against document 0) so that nothing waits for the host."""
        nq, width = cand.shape
        pair_query = torch.arange(nq, device=cand.device, dtype=torch.int32).repeat_interleave(width)
        pair_doc = cand.clamp_min(0).reshape(-1).to(torch.int32)
        if codec is not None:
            got = pair_maxsim(Qc, pair_query, pair_doc, self.doc_offsets, codec=codec,
                              max_len=self.max_len, backend=backend)  # fmt: skip
        elif self.full.device == self.device or (self.device.type == "cuda" and self.full.is_pinned()):
            # pinned host memory is mapped into the GPU's address space: the kernel reads the
            # few documents it needs over the bus, no gather on the host
            got = pair_maxsim(Qc, pair_query, pair_doc, self.doc_offsets, tokens=self.full,
                              max_len=self.max_len, backend=backend)  # fmt: skip
        else:
            ok = cand.reshape(-1) >= 0
            got = torch.zeros(nq * width, device=cand.device)
            got[ok] = self._score_from_host(Qc, pair_query[ok], pair_doc[ok], backend)
        return torch.where(cand >= 0, got.view(nq, width), float("-inf"))

    def _score_from_host(self, Qc, pair_query, pair_doc, backend):
        """Exact scores with the tokens in host memory: the pairs' documents are gathered once each
        and copied to the device."""
        docs, local = torch.unique(pair_doc.long(), return_inverse=True)
        offsets = self.host_offsets
        lo, hi = offsets[docs.cpu()], offsets[docs.cpu() + 1]
        n = hi - lo
        rows = torch.repeat_interleave(lo - torch.cumsum(n, 0) + n, n) + torch.arange(int(n.sum()))
        tokens = self.full.index_select(0, rows).to(self.device, non_blocking=True)
        local_offsets = torch.zeros(docs.shape[0] + 1, dtype=torch.int64)
        local_offsets[1:] = torch.cumsum(n, 0)
        return pair_maxsim(Qc, pair_query, local.int(), local_offsets.to(self.device), tokens=tokens,
                           max_len=self.max_len, backend=backend)  # fmt: skip

    def document_tokens(self, doc: int) -> torch.Tensor:
        """Document ``doc``'s tokens: the kept ones when ``keep_full`` is set, else decompressed
        (float32)."""
        if not 0 <= doc < self.n_slots:
            raise ValueError(f"doc must lie in [0, {self.n_slots}), got {doc}")
        lo, hi = int(self.doc_offsets[doc]), int(self.doc_offsets[doc + 1])
        if self.full is not None:
            return self.full[lo:hi]
        return self._codec.decompress(torch.arange(lo, hi, device=self.device))

    # ------------------------------------------------------------------------- maintenance
    @torch.no_grad()
    def add(
        self, documents: Sequence[torch.Tensor] | torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Append documents, compressed with the index's centroids and buckets (no retraining):
        int64 ids of the new documents, following the last id."""
        tokens, lengths = _packed(documents, lengths)
        if tokens.shape[1] != self.dim:
            raise ValueError(f"the documents have width {tokens.shape[1]}, the index holds d={self.dim}")
        first = self.n_slots
        offsets = torch.zeros(lengths.shape[0] + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(lengths, 0)
        state = {name: getattr(self, name) for name in ("centroids", "cutoffs", "nbits", "normalize", "keep_full")}
        used = self.codes.shape[0]
        if self.full is not None and self._full_store.shape[0] < used + tokens.shape[0]:
            # room for a quarter more, so that a run of small adds copies the tokens rarely
            grown = _new_store(int(1.25 * (used + tokens.shape[0])), self.dim, self.keep_full,
                               self.device, self.full.dtype)  # fmt: skip
            grown[:used].copy_(self.full)
            self._full_store = grown
        store = None if self.full is None else self._full_store[used : used + tokens.shape[0]]
        new = _encode_all(tokens, state, self.device, self.centroids.dtype, first_doc=first,
                          offsets=offsets, store=store)  # fmt: skip
        base = self.doc_offsets[-1]
        self.doc_offsets = torch.cat([self.doc_offsets, base + offsets[1:].to(self.device)])
        self.codes = torch.cat([self.codes, new["codes"]])
        self.residuals = torch.cat([self.residuals, new["residuals"]])
        if self.full is not None:
            self.full = self._full_store[: used + tokens.shape[0]]
            self.host_offsets = self.doc_offsets.cpu()
        self.live = torch.cat([self.live, torch.ones(lengths.shape[0], dtype=torch.bool, device=self.device)])
        self.max_len = max(self.max_len, int(lengths.max()))
        self.list_offsets, self.list_docs = ivf.build_lists(self.codes, self.doc_offsets, self.centroids.shape[0])
        self._codec = Codec(self.codes, self.residuals, self.centroids, self.bucket_weights, self.nbits)
        self._live_count += lengths.shape[0]
        self._max_list = _longest_list(self.list_offsets)
        return torch.arange(first, first + lengths.shape[0])

    def delete(self, ids: torch.Tensor | Sequence[int]) -> None:
        """Remove documents: they are never returned again (their ids are not reused)."""
        ids = torch.as_tensor(ids)
        if ids.is_floating_point() or ids.dtype == torch.bool or ids.dim() > 1:
            raise ValueError(f"ids must be integer document ids, got {describe(ids)}")
        ids = ids.reshape(-1).to(torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.n_slots):
            raise ValueError(f"ids must lie in [0, {self.n_slots}), got values in [{int(ids.min())}, {int(ids.max())}]")
        self.live[ids.to(self.device)] = False
        self._live_count = int(self.live.sum())

    # -------------------------------------------------------------------------- persistence
    _SAVED = ("dim", "nbits", "normalize", "keep_full", "max_len", "centroids", "cutoffs",
              "bucket_weights", "doc_offsets", "live", "codes", "residuals", "list_offsets",
              "list_docs", "full")  # fmt: skip

    def save(self, path: str | os.PathLike) -> None:
        """Write the index to one file (tensors and plain values; :meth:`load` memory-maps it)."""
        state = {"format": FORMAT}
        for name in self._SAVED:
            value = getattr(self, name)
            if isinstance(value, torch.Tensor) and value.untyped_storage().nbytes() != value.nbytes:
                value = value.clone()  # a view of a larger buffer: save only its rows
            state[name] = value.cpu() if isinstance(value, torch.Tensor) else value
        torch.save(state, path)

    @classmethod
    def load(
        cls, path: str | os.PathLike, *, device: torch.device | str | None = None
    ) -> CompressedMaxSimIndex:
        """An index written by :meth:`save`, memory-mapped and moved to ``device`` (default: CPU).
        Kept full tokens stay memory-mapped on the host when the index was saved with
        ``keep_full="host"``. A file that is not such an index raises ``ValueError`` naming it."""
        source = os.fspath(path)
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except (OSError, MemoryError):
            raise
        except Exception:  # not a zip-format torch file: read it the plain way for the error
            state = read_index_file(path, "cpu", "CompressedMaxSimIndex")
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError(f"{source!r} is not a CompressedMaxSimIndex file (format {FORMAT!r})")
        missing = [name for name in cls._SAVED if name not in state]
        if missing:
            raise ValueError(f"{source!r} is missing the fields {missing}")
        device = torch.device(device) if device is not None else torch.device("cpu")
        for name in cls._SAVED:
            value = state[name]
            if isinstance(value, torch.Tensor) and not (name == "full" and state["keep_full"] == "host"):
                state[name] = value.to(device)
        _check_state(state, source)
        dtype = torch.float16 if device.type == "cuda" else torch.float32
        state["centroids"] = state["centroids"].to(dtype)
        if state["full"] is not None and state["keep_full"] == "host":
            state["host_offsets"] = state["doc_offsets"].cpu()
        state["_full_store"] = state["full"]
        del state["format"]
        return cls(state)


def _check_state(state: dict, source: str) -> None:
    """The saved fields fit together (a damaged or hand-edited file fails here, not in a kernel)."""
    try:
        n_tok = state["codes"].shape[0]
        k, dim = state["centroids"].shape
        problems = [
            state["dim"] != dim,
            state["nbits"] not in NBITS,
            tuple(state["residuals"].shape) != (n_tok, dim * state["nbits"] // 8),
            tuple(state["bucket_weights"].shape) != (dim, 1 << state["nbits"]),
            int(state["doc_offsets"][-1]) != n_tok,
            state["live"].shape[0] != state["doc_offsets"].shape[0] - 1,
            state["list_offsets"].shape[0] != k + 1,
            n_tok and not (int(state["codes"].min()) >= 0 and int(state["codes"].max()) < k),
        ]
    except (AttributeError, TypeError, IndexError, KeyError, RuntimeError) as exc:
        raise ValueError(f"{source!r} does not hold a valid CompressedMaxSimIndex: {exc}") from exc
    if any(problems):
        raise ValueError(f"{source!r} does not hold a valid CompressedMaxSimIndex (inconsistent fields)")


def _prepare_tokens(tokens, device, dtype, normalize: bool) -> torch.Tensor:
    x = tokens.to(device, non_blocking=True)
    if x.numel() and not bool(torch.isfinite(x).all()):
        raise ValueError("documents hold NaN or infinite values")
    if normalize:
        x = torch.nn.functional.normalize(x.float(), dim=-1)
    return x.to(dtype)


def _raise_nonfinite(x, offsets, first_row: int, first_doc: int):
    """Name the document of ``x``'s first non-finite token (``x`` starts at packed row
    ``first_row``)."""
    bad = int((~torch.isfinite(x.float())).any(1).nonzero()[0]) + first_row
    doc = int(torch.searchsorted(offsets, torch.tensor(bad), right=True)) - 1
    raise ValueError(f"documents[{first_doc + doc}] holds NaN or infinite values")


def _new_store(rows: int, dim: int, keep, device, dtype) -> torch.Tensor | None:
    """Room for ``rows`` kept tokens: on the device, or in pinned host memory (fp16 for a CUDA
    index, mapped into the GPU's address space; float32 for a CPU one)."""
    if keep is None:
        return None
    if keep == "device":
        return torch.empty(rows, dim, dtype=dtype, device=device)
    host_dtype = torch.float16 if device.type == "cuda" else dtype
    return torch.empty(rows, dim, dtype=host_dtype, pin_memory=torch.cuda.is_available())


def _encode_all(tokens, state, device, dtype, *, first_doc: int, offsets, store) -> dict:
    """Codes and residuals of packed ``tokens``, a chunk at a time; the tokens themselves are
    copied into ``store`` when the index keeps them."""
    codes, residuals = [], []
    for s in range(0, tokens.shape[0], ENCODE_CHUNK):
        x = tokens[s : s + ENCODE_CHUNK]
        try:
            x = _prepare_tokens(x, device, dtype, state["normalize"])
        except ValueError:
            _raise_nonfinite(x, offsets, s, first_doc)
        c, r = codec.encode(x, state["centroids"], state["cutoffs"], state["nbits"])
        codes.append(c)
        residuals.append(r)
        if store is not None:
            store[s : s + x.shape[0]].copy_(x, non_blocking=True)
    if store is not None and device.type == "cuda":
        torch.cuda.synchronize(device)  # the copies into pinned memory are done before any use
    return {"codes": torch.cat(codes), "residuals": torch.cat(residuals)}


def _best_per_query(scores, pair_query, pair_doc, nq: int, n: int, also_read=None) -> torch.Tensor:
    """int64 ``(nq, min(n, most candidates))``: each query's best documents by ``scores`` (pairs
    sorted by query), -1 where a query has fewer. ``also_read`` (a bool tensor) is read in the
    same host synchronisation: True raises the non-finite-query error."""
    counts = torch.bincount(pair_query.long(), minlength=nq)
    most = counts.max() if counts.numel() else counts.new_zeros(())
    flag = also_read if also_read is not None else torch.zeros((), dtype=torch.bool, device=most.device)
    most, bad = torch.stack([most, flag.to(most.dtype)]).tolist()
    if bad:
        raise ValueError("Q holds NaN or infinite values")
    width = max(most, 1)
    first = torch.cumsum(counts, 0) - counts
    pos = torch.arange(pair_query.shape[0], device=scores.device) - first[pair_query.long()]
    dense = torch.full((nq, width), float("-inf"), device=scores.device)
    docs = torch.full((nq, width), -1, dtype=torch.int64, device=scores.device)
    dense[pair_query.long(), pos] = scores
    docs[pair_query.long(), pos] = pair_doc.long()
    return _take(dense, docs, n)


def _longest_list(list_offsets: torch.Tensor) -> int:
    """The most documents any inverted list holds."""
    lengths = list_offsets[1:] - list_offsets[:-1]
    return int(lengths.max()) if lengths.numel() else 0


def _take(scores: torch.Tensor, docs: torch.Tensor, n: int) -> torch.Tensor:
    top = scores.topk(min(n, scores.shape[1]), dim=1)
    picked = docs.gather(1, top.indices)
    return torch.where(torch.isfinite(top.values), picked, -1)
