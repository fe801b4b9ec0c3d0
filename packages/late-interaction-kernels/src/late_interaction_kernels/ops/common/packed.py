"""Moving tokens between the packed (``cu_seqlens``) layout and padded ``(B, L, d)`` blocks.

Both directions are plain indexing, so autograd flows through them; the offsets are read once on
the host (one synchronisation) to size the padded block.
"""

from __future__ import annotations

import torch

from triton_dispatch import common_device


def check_devices(**tensors) -> None:
    """One device for every tensor argument given by keyword (others are left to the type
    checks); the error names each argument and its device."""
    named = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}
    common_device(named.values(), names=named.keys())


def check_offsets(name: str, cu, rows: int) -> torch.Tensor:
    """Validate ``cu`` (``(B + 1,)`` non-decreasing offsets into ``rows`` packed rows) and return
    the lengths ``(B,)`` int64."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(
            f"{name} must be an integer tensor of shape (B + 1,), got {type(cu).__name__}"
        )
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must have shape (B + 1,), got {tuple(cu.shape)}")
    cu = cu.to(torch.int64)
    lengths = cu[1:] - cu[:-1]
    if cu.numel() > 1:
        lo, hi, shortest = torch.stack([cu[0], cu[-1], lengths.min()]).tolist()
        if lo < 0 or hi > rows or shortest < 0:
            raise ValueError(
                f"{name} must be non-decreasing offsets within the {rows} packed rows, "
                f"got {cu.tolist()}"
            )
    return lengths


def loop_bound(name: str, given: int | None, lengths: torch.Tensor) -> int:
    """The longest sequence; a given ``max_seqlen`` must cover it (it is a loop bound, not a hint)."""
    longest = int(lengths.max()) if lengths.numel() else 0
    if given is None:
        return longest
    if isinstance(given, bool) or not isinstance(given, int):
        raise TypeError(f"{name} must be an int or None, got {type(given).__name__}")
    if given < longest:
        raise ValueError(
            f"{name}={given} is smaller than the longest sequence ({longest}); it bounds the loop "
            "over tokens and would drop tokens"
        )
    return longest


def pad(packed: torch.Tensor, cu: torch.Tensor, lengths: torch.Tensor, width: int):
    """``packed (total, d)`` → ``(B, width, d)`` zero-padded and its bool mask ``(B, width)``."""
    b = lengths.numel()
    mask = torch.arange(width, device=packed.device) < lengths.to(packed.device)[:, None]
    out = packed.new_zeros(b, width, packed.shape[-1])
    rows = torch.arange(packed.shape[0], device=packed.device)
    start = cu[:-1].to(device=packed.device, dtype=torch.int64)
    # packed rows outside every sequence (before cu[0] or after cu[-1]) are not read
    seq = torch.repeat_interleave(torch.arange(b, device=packed.device), lengths.to(packed.device))
    first = int(cu[0]) if cu.numel() else 0
    taken = rows[first : first + seq.numel()]
    out = out.index_put((seq, taken - start[seq]), packed[taken])
    return out, mask
