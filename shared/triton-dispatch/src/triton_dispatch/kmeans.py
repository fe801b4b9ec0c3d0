"""k-means on the GPU: a fused nearest-centroid search (one Triton kernel: the points-by-centroids
product and a running argmax, the distance matrix never written) and Lloyd iterations around it.

:func:`nearest_centroid` is the assignment step of every k-means iteration and of every
compression of points against a codebook (a compressed retrieval index assigns each document
token to its centroid; a vector quantizer assigns each row to its code). Squared L2 distance
``|x - c|^2 = |x|^2 - 2 (x . c - |c|^2 / 2)``, so the nearest centroid is the one of largest
``x . c - |c|^2 / 2``; the kernel keeps that running maximum over tiles of centroids, with the
first index reaching it (``torch.argmax``'s rule for ties).
"""

from __future__ import annotations

import torch

from .backend import select_backend, uses_triton

__all__ = ["kmeans", "nearest_centroid", "nearest_centroid_reference"]

#: Points per assignment call of the PyTorch path (bounds its ``(chunk, k)`` score block).
TORCH_CHUNK_ELEMENTS = 1 << 26


def nearest_centroid_reference(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Index (int64 ``(n,)``) of the nearest centroid by squared L2 distance, in float64: the
    specification of :func:`nearest_centroid`."""
    x64, c64 = x.double(), centroids.double()
    return (x64 @ c64.T - 0.5 * (c64 * c64).sum(1)).argmax(1)


def _check(x, centroids) -> None:
    for name, t in (("x", x), ("centroids", centroids)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D (rows, d), got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if x.shape[1] != centroids.shape[1]:
        raise ValueError(
            f"x has width {x.shape[1]} but centroids have width {centroids.shape[1]} (both (rows, d))"
        )
    if centroids.shape[0] == 0:
        raise ValueError("centroids must hold at least one row, got shape (0, d)")
    if x.device != centroids.device:
        raise ValueError(f"x is on {x.device} but centroids are on {centroids.device}")


def _torch_nearest(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    dtype = torch.float32 if x.device.type == "cpu" or x.dtype == torch.float32 else x.dtype
    dtype = torch.float64 if x.dtype == torch.float64 else dtype
    c = centroids.to(dtype)
    half = 0.5 * (c.float() * c.float()).sum(1)
    step = max(1, TORCH_CHUNK_ELEMENTS // max(1, c.shape[0]))
    out = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    for s in range(0, x.shape[0], step):
        scores = (x[s : s + step].to(dtype) @ c.T).float() - half
        out[s : s + step] = scores.argmax(1)
    return out


def nearest_centroid(
    x: torch.Tensor, centroids: torch.Tensor, *, backend: str | None = None
) -> torch.Tensor:
    """Index of the nearest centroid (squared L2) for every row of ``x``.

    Args:
        x: ``(n, d)`` points (float16, bfloat16 or float32; float64 runs the PyTorch path).
        centroids: ``(k, d)``, on the same device.
        backend: ``"triton"``, ``"interpret"`` or ``"torch"`` (default: by device).

    Returns:
        int64 ``(n,)``. Half-precision points are scored in their precision with float32
        accumulation (the kernel) or in float32 (the CPU path); a tie takes the lowest index.
    """
    _check(x, centroids)
    if x.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64, device=x.device)
    chosen = select_backend(x, centroids, backend=backend)
    if not uses_triton(chosen) or x.dtype == torch.float64 or x.shape[1] > 512:
        return _torch_nearest(x, centroids)
    from ._kmeans_kernel import launch_nearest

    return launch_nearest(x, centroids, interpret=chosen == "interpret")


def kmeans(
    x: torch.Tensor,
    k: int,
    *,
    iters: int = 8,
    max_points_per_centroid: int = 256,
    seed: int = 0,
    spherical: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """Lloyd's k-means: ``(k, d)`` float32 centroids of the rows of ``x``.

    At most ``max_points_per_centroid * k`` rows (a seeded random subset) are clustered, as
    faiss and fastkmeans do: more rows refine the centroids little and cost linearly. The
    centroids start as distinct random rows; a centroid that loses every point is moved onto a
    random point. ``spherical=True`` renormalises the centroids to unit length after every step
    (for unit-norm embeddings searched by inner product).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
        raise ValueError(f"iters must be a non-negative int, got {iters!r}")
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x must be a floating-point (n, d) tensor, got {getattr(x, 'shape', x)!r}")
    if x.shape[0] < k:
        raise ValueError(f"k-means of {x.shape[0]} rows into k={k} centroids: need n >= k")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if x.shape[0] > max_points_per_centroid * k:
        keep = torch.randperm(x.shape[0], generator=gen)[: max_points_per_centroid * k]
        x = x[keep.to(x.device)]
    work_dtype = torch.float32 if x.device.type == "cpu" else x.dtype
    points = x.to(work_dtype)
    centroids = points[torch.randperm(points.shape[0], generator=gen)[:k].to(x.device)].float()
    for _ in range(iters):
        codes = nearest_centroid(points, centroids.to(work_dtype), backend=backend)
        sums = torch.zeros_like(centroids).index_add_(0, codes, points.float())
        counts = torch.bincount(codes, minlength=k)
        empty = counts == 0
        centroids = sums / counts.clamp_min(1).unsqueeze(1).float()
        n_empty = int(empty.sum())
        if n_empty:
            pick = torch.randint(0, points.shape[0], (n_empty,), generator=gen).to(x.device)
            centroids[empty] = points[pick].float()
        if spherical:
            centroids = torch.nn.functional.normalize(centroids, dim=1)
    return centroids
