"""Host side of the kernels that load tiles through TMA tensor descriptors (Hopper): which devices
and tensors can take them, and the descriptor over a tensor's token rows."""

from __future__ import annotations

import torch

from triton_dispatch import device_facts, interpreter_enabled, padded_dim

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton < 3.3 has no host-side tensor descriptors: pointer kernels only
    TensorDescriptor = None

#: Coordinates are int32; rows at or past this bound stay on the pointer kernels.
MAX_ROWS = 2**31 - 2**16


def tma_supported(device: torch.device) -> bool:
    """Whether ``device`` runs the TMA kernels: a Hopper GPU (sm_90). Newer GPUs have TMA too, but
    the kernels' configs were measured on Hopper only."""
    return (
        TensorDescriptor is not None
        and device.type == "cuda"
        and not interpreter_enabled()
        and device_facts(device).capability[0] == 9
    )


def rows_fit(dim: int, element_size: int, rows: int) -> bool:
    """Whether ``rows`` token rows of ``dim`` elements can be read through a descriptor: 16-byte
    row strides, a box at most 256 wide, coordinates that fit in int32."""
    return (dim * element_size) % 16 == 0 and padded_dim(dim) <= 256 and rows < MAX_ROWS


def aligned(t: torch.Tensor) -> bool:
    """A descriptor's base must be 16-byte aligned (a view may start anywhere); no empty boxes."""
    return t.data_ptr() % 16 == 0 and t.numel() > 0


def rows_descriptor(t: torch.Tensor, dim: int, box: list[int]):
    """The contiguous tensor ``t`` as ``(tokens, dim)`` rows read in ``box`` tiles (zeros past the
    last row and past ``dim``)."""
    return TensorDescriptor(t, [t.numel() // dim, dim], [dim, 1], box)
