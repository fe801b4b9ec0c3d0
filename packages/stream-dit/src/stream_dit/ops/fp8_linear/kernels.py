"""The rounding every kernel that writes row-scaled e4m3 operands shares: a float32 value already
divided by its row's scale (so within ±448) rounded to the nearest e4m3 value, ties to even,
before the cast. Rounding here rather than in the cast keeps the cast exact, so a kernel gives
the same codes compiled for a GPU and in Triton's interpreter."""

from __future__ import annotations

import triton
import triton.language as tl

E4M3_MAX: tl.constexpr = tl.constexpr(448.0)


@triton.jit
def round_to_e4m3(v):
    """``v`` (float32, ``|v| <= 448``) rounded to the e4m3 grid, ties to even: three mantissa
    bits below each power of two from 2⁻⁶ up, a step of 2⁻⁹ below it (the subnormals)."""
    bits = v.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127
    exponent = tl.maximum(exponent, -6)
    # 2^(exponent - 3), built from its bits: an exact power of two, so v / step is exact
    step = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)
    t = v / step
    low = tl.floor(t)
    frac = t - low
    odd = (low - 2.0 * tl.floor(low * 0.5)) != 0.0
    up = (frac > 0.5) | ((frac == 0.5) & odd)
    return tl.where(up, low + 1.0, low) * step


@triton.jit
def quantize_row_block(y, row_ok):
    """``(q, scale)`` of a ``(BLOCK_M, BLOCK_D)`` float32 block of whole rows (padded columns
    zero): each row's scale ``max(amax, 1e-12) / 448`` and its values rounded to e4m3."""
    amax = tl.max(tl.abs(y), axis=1)
    scale = tl.maximum(amax / E4M3_MAX, 1e-12)
    scale = tl.where(row_ok, scale, 1.0)
    q = round_to_e4m3(tl.minimum(tl.maximum(y / scale[:, None], -E4M3_MAX), E4M3_MAX))
    return q.to(tl.float8e4nv), scale
