"""Seeded random inputs: stable seeds, host generators, and tensors and masks drawn on the host so a
seed gives the same values on every device."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch


def seed_for(*parts: object) -> int:
    """A stable 63-bit seed from any printable parts (e.g. a session seed and a test id)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def generator(seed: int) -> torch.Generator:
    """A CPU generator: inputs are drawn on the host and moved, so a seed gives the same values on
    every device."""
    return torch.Generator(device="cpu").manual_seed(int(seed))


def randn(
    shape: Sequence[int],
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    scale: float = 1.0,
    requires_grad: bool = False,
) -> torch.Tensor:
    """Standard-normal values × ``scale``, drawn in float64 on the host then cast."""
    t = torch.randn(tuple(shape), generator=generator, dtype=torch.float64) * scale
    return t.to(device=device, dtype=dtype).requires_grad_(requires_grad)


def rand_mask(
    shape: Sequence[int],
    *,
    p_valid: float = 0.8,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """A bool mask, True with probability ``p_valid``."""
    return (torch.rand(tuple(shape), generator=generator) < p_valid).to(device)


def randint(
    low: int,
    high: int,
    shape: Sequence[int],
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.int64,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    return torch.randint(low, high, tuple(shape), generator=generator).to(
        device=device, dtype=dtype
    )


def lengths_mask(lengths: torch.Tensor | Sequence[int], max_len: int) -> torch.Tensor:
    """``(len(lengths), max_len)`` bool mask with the first ``lengths[i]`` entries of row i True."""
    lengths = torch.as_tensor(lengths)
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]
