"""Triton building blocks shared by the one-program-per-query kernels (top-k, fp8): load a tile
of token rows, and score a query tile against it."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_rows(PTR, rows, row_ok, ks, k_ok, dim, UPCAST: tl.constexpr):
    """Rows ``rows`` (int64 token indices) of a ``(tokens, dim)`` tensor as a ``(R, BLOCK_K)``
    tile, zeros outside; upcast to fp32 where the interpreter's bf16 dot is wrong."""
    x = tl.load(
        PTR + rows[:, None] * dim + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0
    )
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def dot_rows(q, x, IEEE: tl.constexpr):
    """``q @ x.T`` in fp32 (IEEE products for fp32 operands: TF32 would cost ~1e-3)."""
    if IEEE:
        s = tl.dot(q, tl.trans(x), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(x), out_dtype=tl.float32)
    return s
