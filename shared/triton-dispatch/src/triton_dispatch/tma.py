"""Host side of kernels that load tiles through TMA tensor descriptors (Hopper): Triton's
host-side :class:`TensorDescriptor` (``None`` before Triton 3.3), which devices run such kernels,
and whether a tensor can be a descriptor's base."""

from __future__ import annotations

import torch

from .backend import interpreter_enabled
from .device import device_facts

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton < 3.3 has no host-side tensor descriptors: pointer kernels only
    TensorDescriptor = None

__all__ = ["TensorDescriptor", "aligned", "tma_supported"]


def tma_supported(device: torch.device) -> bool:
    """Whether ``device`` runs descriptor kernels: a Hopper GPU (sm_90) outside the interpreter.
    Newer GPUs have TMA too, but the kernels' configs were measured on Hopper only."""
    return (
        TensorDescriptor is not None
        and device.type == "cuda"
        and not interpreter_enabled()
        and device_facts(device).capability[0] == 9
    )


def aligned(t: torch.Tensor) -> bool:
    """A descriptor's base must be 16-byte aligned (a view may start anywhere); no empty boxes."""
    return t.data_ptr() % 16 == 0 and t.numel() > 0
