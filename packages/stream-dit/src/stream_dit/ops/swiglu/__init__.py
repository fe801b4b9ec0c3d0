"""The SwiGLU gate ``silu(gate)·up`` of a fused gate/up projection in one pass. The declaration
in :mod:`.op`, the kernel in :mod:`.kernels`, the spec in :mod:`.reference`."""

from __future__ import annotations

import torch

from .op import SWIGLU, SWIGLU_FP8
from .reference import swiglu_fp8_reference, swiglu_reference


def swiglu(gate_up: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """``silu(gate)·up`` ``(..., I)`` for a contiguous ``gate_up`` ``(..., 2I)`` holding ``[gate |
    up]`` along its last dimension (the output of one GEMM against the stacked weights).

    Raises:
        ValueError / TypeError: naming ``gate_up``, for an odd last dimension or a bad dtype.
    """
    return SWIGLU(gate_up, backend=backend)


def swiglu_fp8(
    gate_up: torch.Tensor, *, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out_q, out_scale)``: :func:`swiglu`'s rows as ``torch.float8_e4m3fn`` ``(..., I)`` with a
    float32 scale per row ``(...,)`` (``amax / 448``, rounded to nearest, ties to even), the
    operand of :func:`~stream_dit.ops.fp8_linear.fp8_linear`. Same arguments and errors."""
    return SWIGLU_FP8(gate_up, backend=backend)


__all__ = ["swiglu", "swiglu_fp8", "swiglu_fp8_reference", "swiglu_reference"]
