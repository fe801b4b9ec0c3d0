"""The Triton kernel of :func:`triton_dispatch.kmeans.nearest_centroid`: a row block of points
against tiles of centroids, ``x . c - |c|^2 / 2`` from one ``tl.dot`` per tile, a running max and
argmax per row in registers."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .autotune import padded_dim


@triton.jit
def nearest_centroid_kernel(
    X, C, HALF_NORM, OUT, n, k, d, stride_x, stride_c,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    x = tl.load(X + rows[:, None] * stride_x + dims[None, :],
                mask=(rows < n)[:, None] & (dims < d)[None, :], other=0.0)  # fmt: skip
    if UPCAST:
        x = x.to(tl.float32)
    best = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    best_i = tl.zeros((BLOCK_M,), tl.int32)
    for c0 in range(0, k, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)
        c = tl.load(C + cols[None, :].to(tl.int64) * stride_c + dims[:, None],
                    mask=(cols < k)[None, :] & (dims < d)[:, None], other=0.0)  # fmt: skip
        if UPCAST:
            c = c.to(tl.float32)
        half = tl.load(HALF_NORM + cols, mask=cols < k, other=float("inf"))
        s = tl.dot(x, c) - half[None, :]
        tile_best = tl.max(s, 1)
        # the first column reaching the tile's max (argmax's tie rule)
        tile_i = tl.min(tl.where(s == tile_best[:, None], cols[None, :], k), 1)
        better = tile_best > best
        best = tl.where(better, tile_best, best)
        best_i = tl.where(better, tile_i, best_i)
    tl.store(OUT + rows, best_i.to(tl.int64), mask=rows < n)


def launch_nearest(x: torch.Tensor, centroids: torch.Tensor, *, interpret: bool) -> torch.Tensor:
    """Launch :func:`nearest_centroid_kernel` over ``x``'s rows; ``(n,)`` int64."""
    dtype = x.dtype if x.dtype in (torch.float16, torch.bfloat16) else torch.float32
    x = x.to(dtype)
    if x.stride(1) != 1:
        x = x.contiguous()
    c = centroids.to(dtype).contiguous()
    half = 0.5 * (c.float() * c.float()).sum(1)
    n, d = x.shape
    out = torch.empty(n, dtype=torch.int64, device=x.device)
    # bf16 dots are wrong in Triton's interpreter; fp32 operands keep it exact there
    upcast = interpret or dtype == torch.float32
    if interpret:
        block_m, block_n, warps, stages = 64, 64, 4, 1
    else:
        block_m, block_n, warps, stages = 128, 128, 8, 3
    grid = (triton.cdiv(n, block_m),)
    nearest_centroid_kernel[grid](
        x, c, half, out, n, c.shape[0], d, x.stride(0), c.stride(0),
        UPCAST=upcast, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=padded_dim(d),
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out
