"""Specification of the SwiGLU gate of a fused gate/up projection, in plain PyTorch."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def swiglu_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate)·up`` for ``gate_up`` ``(..., 2I)`` holding ``[gate | up]`` along its last
    dimension: ``(..., I)``, computed in float32 (float64 for float64 input), rounded once."""
    work = torch.float64 if gate_up.dtype == torch.float64 else torch.float32
    gate, up = gate_up.to(work).chunk(2, dim=-1)
    return (F.silu(gate) * up).to(gate_up.dtype)
