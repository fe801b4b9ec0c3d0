"""Poisoned outputs: buffers filled with a value no correct kernel writes, so a kernel that skips
an element cannot pass by leaving an old value behind."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` in place with a value no correct kernel writes (NaN, or the integer minimum)."""
    if t.is_floating_point() or t.is_complex():
        return t.fill_(float("nan"))
    if t.dtype == torch.bool:
        raise TypeError("a bool tensor cannot be poisoned")
    return t.fill_(torch.iinfo(t.dtype).min)


def poisoned(
    shape: Sequence[int], *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """A new tensor of ``shape`` filled by :func:`poison_`."""
    return poison_(torch.empty(tuple(shape), dtype=dtype, device=device))


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    return poison_(torch.empty_like(t))
