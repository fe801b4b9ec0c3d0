"""Training and applying the compressed index's codec: k-means centroids (triton-dispatch's
fused nearest-centroid search), per-dimension residual buckets from quantiles, and the packing of
bucket indices (:mod:`.reference` gives the layout)."""

from __future__ import annotations

import torch

from triton_dispatch.kmeans import kmeans, nearest_centroid

from .reference import pack_buckets

#: Residual rows whose quantiles place the bucket cutoffs.
QUANTILE_ROWS = 1 << 16


def default_centroids(n_tokens: int) -> int:
    """PLAID's rule: the power of two at or below ``16 * sqrt(tokens)``, at most the tokens."""
    k = 1 << max(0, int(16 * n_tokens**0.5).bit_length() - 1)
    return max(1, min(k, n_tokens))


def train(sample: torch.Tensor, n_centroids: int, nbits: int, *, iters: int, seed: int,
          spherical: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(centroids (K, d) compute dtype, cutoffs (d, 2**nbits - 1), weights (d, 2**nbits))``
    float32 buckets, from a sample of the collection's tokens."""
    centroids = kmeans(sample, n_centroids, iters=iters, seed=seed, spherical=spherical)
    centroids = centroids.to(sample.dtype if sample.device.type == "cuda" else torch.float32)
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    rows = torch.randperm(sample.shape[0], generator=gen)[:QUANTILE_ROWS].to(sample.device)
    part = sample[rows]
    residual = part.float() - centroids[nearest_centroid(part, centroids)].float()
    ordered = residual.sort(0).values  # (n, d)
    n, levels = ordered.shape[0], 1 << nbits

    def quantile(q: torch.Tensor) -> torch.Tensor:  # (len(q),) → (d, len(q))
        at = (q * (n - 1)).round().long().clamp(0, n - 1).to(ordered.device)
        return ordered[at].T.contiguous()

    steps = torch.arange(levels, dtype=torch.float64)
    cutoffs = quantile((steps[1:]) / levels)
    weights = quantile((steps + 0.5) / levels)
    return centroids, cutoffs, weights


def encode(tokens: torch.Tensor, centroids: torch.Tensor, cutoffs: torch.Tensor, nbits: int):
    """``(codes int32 (m,), residuals uint8 (m, d * nbits / 8))`` of ``tokens (m, d)`` (on the
    centroids' device)."""
    codes = nearest_centroid(tokens.to(centroids.dtype), centroids)
    residual = tokens.float() - centroids[codes].float()
    buckets = torch.searchsorted(cutoffs, residual.T.contiguous()).T
    return codes.to(torch.int32), pack_buckets(buckets, nbits)
