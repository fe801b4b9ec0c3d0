"""The SwiGLU gate ``silu(gate)·up`` of a fused gate/up projection in one pass. The declaration
in :mod:`.op`, the kernel in :mod:`.kernels`, the spec in :mod:`.reference`."""

from __future__ import annotations

import torch

from .op import SWIGLU
from .reference import swiglu_reference


def swiglu(gate_up: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """``silu(gate)·up`` ``(..., I)`` for a contiguous ``gate_up`` ``(..., 2I)`` holding ``[gate |
    up]`` along its last dimension (the output of one GEMM against the stacked weights).

    Raises:
        ValueError / TypeError: naming ``gate_up``, for an odd last dimension or a bad dtype.
    """
    return SWIGLU(gate_up, backend=backend)


__all__ = ["swiglu", "swiglu_reference"]
