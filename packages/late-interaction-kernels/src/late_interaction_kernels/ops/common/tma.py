"""Token rows as TMA tensor descriptors for the Hopper kernels (which devices and tensors take
descriptors at all: :mod:`triton_dispatch.tma`)."""

from __future__ import annotations

import torch

from triton_dispatch import padded_dim
from triton_dispatch.tma import TensorDescriptor, aligned, tma_supported

__all__ = ["MAX_ROWS", "aligned", "rows_descriptor", "rows_fit", "tma_supported"]

#: Coordinates are int32; rows at or past this bound stay on the pointer kernels.
MAX_ROWS = 2**31 - 2**16


def rows_fit(dim: int, element_size: int, rows: int) -> bool:
    """Whether ``rows`` token rows of ``dim`` elements can be read through a descriptor: 16-byte
    row strides, a box at most 256 wide, coordinates that fit in int32."""
    return (dim * element_size) % 16 == 0 and padded_dim(dim) <= 256 and rows < MAX_ROWS


def rows_descriptor(t: torch.Tensor, dim: int, box: list[int]):
    """The contiguous tensor ``t`` as ``(tokens, dim)`` rows read in ``box`` tiles (zeros past the
    last row and past ``dim``)."""
    return TensorDescriptor(t, [t.numel() // dim, dim], [dim, 1], box)
