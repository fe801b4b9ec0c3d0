"""CompressedMaxSimIndex: the pair kernels against their float64 references (interpreter on CPU,
compiled on CUDA), the codec, search quality against exact MaxSim, add / delete, save / load, and
bad inputs."""

from __future__ import annotations

import itertools

import pytest
import torch

from late_interaction_kernels import CompressedMaxSimIndex, MaxSimIndex
from late_interaction_kernels.ops.compressed import codec as codec_mod
from late_interaction_kernels.ops.compressed import index as index_mod
from late_interaction_kernels.ops.compressed import ivf
from late_interaction_kernels.ops.compressed.pairs import (
    Codec,
    centroid_pair_scores,
    pair_maxsim,
    probed_centroid_scores,
)
from late_interaction_kernels.ops.compressed.reference import (
    centroid_pair_scores_reference,
    decompress_reference,
    pack_buckets,
    residual_pair_scores_reference,
    token_pair_scores_reference,
    unpack_buckets,
)
from triton_dispatch.kmeans import kmeans, nearest_centroid, nearest_centroid_reference
from triton_dispatch.testing import poisoned

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _unit(x):
    return torch.nn.functional.normalize(x, dim=-1)


def _collection(gen, n_docs, dim, device, lo=1, hi=9):
    lengths = torch.randint(lo, hi + 1, (n_docs,), generator=gen)
    tokens = _unit(torch.randn(int(lengths.sum()), dim, generator=gen)).to(device)
    offsets = torch.zeros(n_docs + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    return tokens, lengths, offsets.to(device)


@pytest.mark.parametrize("nbits", [1, 2, 4, 8])
def test_pack_unpack_roundtrip(nbits, seed):
    gen = torch.Generator().manual_seed(seed)
    buckets = torch.randint(0, 1 << nbits, (7, 16), generator=gen)
    packed = pack_buckets(buckets, nbits)
    assert packed.shape == (7, 16 * nbits // 8) and packed.dtype == torch.uint8
    assert torch.equal(unpack_buckets(packed, nbits, 16), buckets)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_nearest_centroid_matches_float64(device, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(150, 24, generator=gen).to(device, dtype)
    c = torch.randn(70, 24, generator=gen).to(device, dtype)
    got = nearest_centroid(x, c)
    ref = nearest_centroid_reference(x, c)
    x64, c64 = x.double(), c.double()
    dist = torch.cdist(x64, c64) ** 2
    # the pick is the float64 nearest, or within rounding of its distance
    chosen, best = dist.gather(1, got[:, None])[:, 0], dist.gather(1, ref[:, None])[:, 0]
    tol = 1e-9 if dtype == torch.float32 and device == "cpu" else 2e-2
    assert (chosen - best).abs().max() <= tol * dist.max()
    assert (got == ref).float().mean() > 0.9


def test_kmeans_steps_never_raise_the_objective(seed):
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(6, 8, generator=gen) * 4
    x = centers[torch.arange(300) % 6] + torch.randn(300, 8, generator=gen)

    def sse(c):
        return float(((x.double() - c.double()[nearest_centroid_reference(x, c)]) ** 2).sum())

    init = kmeans(x, 6, iters=0, seed=seed)
    # iters=0 is the initialisation: distinct rows of x
    assert ((init[:, None].double() - x[None].double()).norm(dim=-1).min(1).values < 1e-6).all() and torch.unique(init, dim=0).shape[0] == 6
    values = [sse(kmeans(x, 6, iters=n, seed=seed)) for n in (0, 1, 2, 6)]
    assert all(b <= a * (1 + 1e-6) for a, b in itertools.pairwise(values)), values
    unit = kmeans(torch.nn.functional.normalize(x, dim=1), 6, iters=3, seed=seed, spherical=True)
    torch.testing.assert_close(unit.norm(dim=1), torch.ones(6))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nbits", [2, 4])
def test_pair_kernels_match_float64(device, nbits, seed):
    gen = torch.Generator().manual_seed(seed)
    dim, n_docs, k = 32, 12, 16
    tokens, lengths, offsets = _collection(gen, n_docs, dim, device, lo=1, hi=40)
    centroids = _unit(torch.randn(k, dim, generator=gen)).to(device)
    codes = torch.randint(0, k, (tokens.shape[0],), generator=gen, dtype=torch.int32).to(device)
    residuals = torch.randint(0, 256, (tokens.shape[0], dim * nbits // 8), generator=gen).to(device, torch.uint8)
    weights = (0.05 * torch.randn(dim, 1 << nbits, generator=gen)).to(device)
    Q = _unit(torch.randn(3, 5, dim, generator=gen)).to(device)
    Q[1, 3:] = 0  # masked query tokens arrive zeroed
    pq = torch.tensor([0, 0, 1, 2, 2, 1, 0], dtype=torch.int32, device=device)
    pd = torch.tensor([0, 3, 3, 11, 5, 7, 9], dtype=torch.int32, device=device)
    max_len = int(lengths.max())
    codec = Codec(codes, residuals, centroids, weights, nbits)

    out = poisoned((7,), dtype=torch.float32, device=device)
    got = pair_maxsim(Q, pq, pd, offsets, codec=codec, max_len=max_len, out=out)
    ref = residual_pair_scores_reference(Q, pq, pd, codes, residuals, offsets, centroids, weights, nbits)
    assert got is out
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)

    exact = pair_maxsim(Q, pq, pd, offsets, tokens=tokens, max_len=max_len,
                        out=poisoned((7,), dtype=torch.float32, device=device))  # fmt: skip
    ref = token_pair_scores_reference(Q, pq, pd, tokens, offsets)
    torch.testing.assert_close(exact.double(), ref, rtol=1e-5, atol=1e-5)

    qcs = torch.matmul(centroids, Q.transpose(1, 2)).contiguous()
    approx = centroid_pair_scores(qcs, pq, pd, codes, offsets, max_len=max_len,
                                  out=poisoned((7,), dtype=torch.float32, device=device))  # fmt: skip
    ref = centroid_pair_scores_reference(qcs, pq, pd, codes, offsets)
    torch.testing.assert_close(approx.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pair_kernels_half_precision_on_gpu(seed):
    gen = torch.Generator().manual_seed(seed)
    dim, n_docs = 128, 64
    tokens, lengths, offsets = _collection(gen, n_docs, dim, "cuda", lo=1, hi=200)
    Q = _unit(torch.randn(4, 32, dim, generator=gen)).cuda()
    pq = torch.randint(0, 4, (300,), generator=gen, dtype=torch.int32).cuda()
    pd = torch.randint(0, n_docs, (300,), generator=gen, dtype=torch.int32).cuda()
    got = pair_maxsim(Q.half(), pq, pd, offsets, tokens=tokens.half(), max_len=int(lengths.max()))
    ref = token_pair_scores_reference(Q.half(), pq, pd, tokens.half(), offsets)
    assert ((got.double() - ref).abs() / ref.abs().clamp_min(1)).max() < 2e-3


def _index_and_exact(seed, where, n_docs=24, dim=16, **options):
    """Clustered documents and queries on ``where``, and the index built from them (``options``
    go to ``build``, its ``device`` among them)."""
    gen = torch.Generator().manual_seed(seed)
    topics = _unit(torch.randn(6, dim, generator=gen))
    docs = []
    for _ in range(n_docs):
        t = topics[torch.randint(0, 6, (1,), generator=gen)]
        n = int(torch.randint(2, 7, (1,), generator=gen))
        docs.append(_unit(t + 0.6 * torch.randn(n, dim, generator=gen)).to(where))
    options.setdefault("n_centroids", 16)
    index = CompressedMaxSimIndex.build(docs, seed=seed, **options)
    Q = _unit(topics[torch.randint(0, 6, (3,), generator=gen)][:, None]
              + 0.6 * torch.randn(3, 5, dim, generator=gen)).to(where)  # fmt: skip
    return docs, index, Q


@pytest.mark.parametrize("device", DEVICES)
def test_search_with_rerank_is_exact(device, seed):
    docs, index, Q = _index_and_exact(seed, device, keep_full="device", nbits=2)
    exact_scores, _exact_ids = MaxSimIndex(docs).topk(Q, 5)
    # every document is a candidate (n_candidates covers the collection) and reaches the rerank
    scores, ids = index.search(Q, 5, n_probe=16, n_candidates=24, n_rerank=24)
    # on CUDA the index keeps fp16 tokens and scores fp16 queries (float32 accumulation)
    tol = 1e-4 if device == "cpu" else 3e-3
    torch.testing.assert_close(scores.cpu(), exact_scores.cpu(), rtol=tol, atol=tol)
    assert ids.dtype == torch.int64 and ids.shape == (3, 5)
    got = MaxSimIndex(docs).scores(Q).gather(1, ids)
    torch.testing.assert_close(got.cpu(), exact_scores.cpu(), rtol=tol, atol=tol)


@pytest.fixture(params=["dense", "pairs"])
def candidate_path(request, monkeypatch):
    """Both ways to candidates: dense score rows (small batches) and sorted pairs (large ones)."""
    if request.param == "pairs":
        monkeypatch.setattr(index_mod, "DENSE_CELLS", 0)
    return request.param


@pytest.mark.parametrize("backend", ["kernel", "torch"])
def test_probed_lists_scores_match_float64(backend, seed):
    _docs, index, Q = _index_and_exact(seed, "cpu", n_docs=30, keep_full=None)
    Qc = Q.to(index.centroids.dtype)
    qcs = torch.matmul(index.centroids, Qc.transpose(1, 2)).contiguous()
    gen = torch.Generator().manual_seed(seed)
    probes = torch.randint(-1, index.centroids.shape[0], (3, 7), generator=gen).sort(1).values
    probes[:, 1:][probes[:, 1:] == probes[:, :-1]] = -1  # each centroid once per row
    got = probed_centroid_scores(
        qcs, probes, index.list_offsets, index.list_docs, index.codes, index.doc_offsets,
        n_docs=index.n_slots, max_len=index.max_len, max_list=index._max_list,
        backend=None if backend == "kernel" else "torch",
    )  # fmt: skip
    pq, pd = ivf.candidates(probes, index.list_offsets, index.list_docs, index.n_slots)
    want = torch.full((3, index.n_slots), float("-inf"), dtype=torch.float64)
    want[pq.long(), pd.long()] = centroid_pair_scores_reference(qcs, pq, pd, index.codes, index.doc_offsets)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert pq.numel() > 0
    torch.testing.assert_close(got.double()[pq.long(), pd.long()], want[pq.long(), pd.long()],
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_dense_and_pair_candidates_agree(seed, monkeypatch):
    _docs, index, Q = _index_and_exact(seed, "cpu", n_docs=40, keep_full="host")
    dense = index.search(Q, 5, n_probe=2, n_candidates=12, n_rerank=8)
    monkeypatch.setattr(index_mod, "DENSE_CELLS", 0)
    pairs = index.search(Q, 5, n_probe=2, n_candidates=12, n_rerank=8)
    torch.testing.assert_close(dense[0], pairs[0])
    # equal scores may come back in either order: compare the ids' sets where the scores tie
    assert torch.equal(dense[1].sort(1).values, pairs[1].sort(1).values) or torch.equal(
        dense[0], pairs[0]
    )


def test_search_scores_are_decompressed_maxsim(seed, candidate_path):
    _docs, index, Q = _index_and_exact(seed, "cpu", nbits=4, keep_full=None)
    scores, ids = index.search(Q, 4, n_probe=3, n_candidates=20)
    tokens = decompress_reference(index.codes, index.residuals, index.centroids,
                                  index.bucket_weights, index.nbits)  # fmt: skip
    for qi in range(Q.shape[0]):
        for s, doc in zip(scores[qi].tolist(), ids[qi].tolist()):
            lo, hi = int(index.doc_offsets[doc]), int(index.doc_offsets[doc + 1])
            ref = (Q[qi].double() @ tokens[lo:hi].T).max(1).values.sum()
            assert abs(s - float(ref)) < 1e-4
    # the single-query form and q_mask
    _s1, i1 = index.search(Q[0], 4, n_probe=3, n_candidates=20)
    assert torch.equal(i1, ids[0])
    mask = torch.ones(Q.shape[:2], dtype=torch.bool)
    mask[:, 3:] = False
    sm, im = index.search(Q, 4, mask, n_probe=3, n_candidates=20)
    s_cut, i_cut = index.search(Q[:, :3].contiguous(), 4, n_probe=3, n_candidates=20)
    assert torch.equal(im, i_cut)
    torch.testing.assert_close(sm, s_cut)


def test_add_and_delete(seed, candidate_path):
    docs, index, Q = _index_and_exact(seed, "cpu", keep_full="host")
    full_scores, full_ids = index.search(Q, 5, n_probe=16, n_candidates=30, n_rerank=30)
    part = CompressedMaxSimIndex.build(docs[:20], n_centroids=16, seed=seed, keep_full="host")
    new_ids = part.add(docs[20:])
    assert new_ids.tolist() == list(range(20, len(docs)))
    scores, ids = part.search(Q, 5, n_probe=16, n_candidates=30, n_rerank=30)
    assert torch.equal(ids, full_ids)
    torch.testing.assert_close(scores, full_scores)
    gone = full_ids[:, 0].unique()
    part.delete(gone)
    assert len(part) == len(docs) - gone.numel()
    _, after = part.search(Q, 5, n_probe=16, n_candidates=30)
    assert not torch.isin(after, gone).any()
    part.add(docs[:2])  # deleted ids stay deleted after an add
    _, again = part.search(Q, 5, n_probe=16, n_candidates=30)
    assert not torch.isin(again, gone).any()


def test_save_load_roundtrip_and_bad_files(tmp_path, seed):
    _docs, index, Q = _index_and_exact(seed, "cpu", keep_full="host")
    index.delete([3])
    path = tmp_path / "index.pt"
    index.save(path)
    loaded = CompressedMaxSimIndex.load(path)
    a = index.search(Q, 5, n_probe=4, n_candidates=20)
    b = loaded.search(Q, 5, n_probe=4, n_candidates=20)
    assert torch.equal(a[1], b[1]) and torch.equal(a[0], b[0]) and len(loaded) == len(index)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not an index at all")
    with pytest.raises(ValueError, match=r"junk\.bin"):
        CompressedMaxSimIndex.load(junk)
    other = tmp_path / "other.pt"
    torch.save({"format": 1, "documents": torch.zeros(2, 3, 4)}, other)
    with pytest.raises(ValueError, match=r"other\.pt"):
        CompressedMaxSimIndex.load(other)


def test_bad_inputs(seed, candidate_path):
    gen = torch.Generator().manual_seed(seed)
    docs = [_unit(torch.randn(4, 16, generator=gen)) for _ in range(20)]
    with pytest.raises(ValueError, match=r"documents\[2\] has no tokens"):
        CompressedMaxSimIndex.build([*docs[:2], torch.empty(0, 16), *docs[2:]], n_centroids=4)
    bad = [d.clone() for d in docs]
    bad[5][1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"documents\[5\] holds NaN"):
        CompressedMaxSimIndex.build(bad, n_centroids=4)
    with pytest.raises(ValueError, match="same embedding width"):
        CompressedMaxSimIndex.build([*docs, torch.randn(3, 8)], n_centroids=4)
    with pytest.raises(ValueError, match="nbits"):
        CompressedMaxSimIndex.build(docs, nbits=3)
    with pytest.raises(ValueError, match="empty"):
        CompressedMaxSimIndex.build([])
    index = CompressedMaxSimIndex.build(docs, n_centroids=4, kmeans_iters=1)
    # k past the live documents is clamped, as MaxSimIndex.topk and retrieve do
    scores, ids = index.search(docs[0], 21)
    assert scores.shape == ids.shape == (20,) and sorted(ids.tolist()) == list(range(20))
    with pytest.raises(ValueError, match="width 8"):
        index.search(torch.randn(2, 3, 8), 2)
    with pytest.raises(ValueError, match="NaN"):
        index.search(torch.full((2, 3, 16), float("nan")), 2)
    with pytest.raises(ValueError, match="k must be"):
        index.search(docs[0], 0)
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 20\)"):
        index.delete([20])
    with pytest.raises(ValueError, match="width 8"):
        index.add([torch.randn(2, 8)])


def test_default_centroids_follows_plaid():
    assert codec_mod.default_centroids(80_000_000) == 131072
    assert codec_mod.default_centroids(8_000_000) == 32768
    assert codec_mod.default_centroids(3) == 3


def test_kept_tokens_survive_adds_and_saves(tmp_path, seed):
    gen = torch.Generator().manual_seed(seed)
    docs = [_unit(torch.randn(int(torch.randint(1, 6, (1,), generator=gen)), 16, generator=gen)) for _ in range(30)]
    index = CompressedMaxSimIndex.build(docs[:10], n_centroids=4, kmeans_iters=1)
    for part in (docs[10:11], docs[11:25], docs[25:]):  # a small add, then ones past the room left
        index.add(part)
    for i, doc in enumerate(docs):
        assert torch.equal(index.document_tokens(i), doc)
    path = tmp_path / "grown.pt"
    index.save(path)
    loaded = CompressedMaxSimIndex.load(path)
    assert loaded.full.shape == (sum(d.shape[0] for d in docs), 16)
    assert all(torch.equal(loaded.document_tokens(i), doc) for i, doc in enumerate(docs))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("keep_full", ["host", "device"])
def test_cuda_search_reranks_from_kept_tokens(keep_full, seed):
    """On CUDA the rerank kernel reads pinned host tokens in place (mapped memory) or the
    card's copy; either way the result is exact MaxSim over the fp16 tokens."""
    docs, index, Q = _index_and_exact(seed, "cpu", n_docs=300, keep_full=keep_full, device="cuda")
    assert index.full.is_pinned() == (keep_full == "host")
    scores, ids = index.search(Q.cuda(), 5, n_probe=16, n_candidates=300, n_rerank=300)
    half = [d.half().float() for d in docs]
    exact_scores, exact_ids = MaxSimIndex(half).topk(Q.half().float(), 5)
    assert torch.equal(ids.cpu(), exact_ids)
    torch.testing.assert_close(scores.cpu(), exact_scores, rtol=2e-3, atol=2e-3)
    index.add(docs[:5])
    assert torch.equal(index.document_tokens(300).cpu().float(), half[0])


def test_a_rerank_narrower_than_k_still_returns_k(seed):
    _docs, index, Q = _index_and_exact(seed, "cpu", keep_full="host")
    scores, ids = index.search(Q, 5, n_probe=16, n_candidates=24, n_rerank=2)
    assert (ids >= 0).all() and torch.isfinite(scores).all()
