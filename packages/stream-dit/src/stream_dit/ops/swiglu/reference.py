"""Specification of the SwiGLU gate of a fused gate/up projection, in plain PyTorch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..fp8_linear.reference import quantize_rows_reference


def swiglu_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate)·up`` for ``gate_up`` ``(..., 2I)`` holding ``[gate | up]`` along its last
    dimension: ``(..., I)``, computed in float32 (float64 for float64 input), rounded once."""
    work = torch.float64 if gate_up.dtype == torch.float64 else torch.float32
    gate, up = gate_up.to(work).chunk(2, dim=-1)
    return (F.silu(gate) * up).to(gate_up.dtype)


def swiglu_fp8_reference(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out_q, out_scale)``: ``silu(gate)·up``, unrounded, as float8 e4m3 rows ``(..., I)``
    with a float32 scale per row ``(...,)``
    (:func:`~stream_dit.ops.fp8_linear.reference.quantize_rows_reference`)."""
    work = torch.float64 if gate_up.dtype == torch.float64 else torch.float32
    gate, up = gate_up.to(work).chunk(2, dim=-1)
    return quantize_rows_reference(F.silu(gate) * up)
