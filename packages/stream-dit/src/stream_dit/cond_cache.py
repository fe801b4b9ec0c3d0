"""Memo of padded encoder-state batches across ticks.

While the set of active requests does not change, every tick would pad the same conditioning into
the same ``(R, L, D)`` batch; the memo returns the batch built last time. Keys are the identities of
the input tensors, and each entry holds references to those tensors, so an id cannot be recycled by
a new tensor while its entry is alive.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch


class PaddedStatesCache:
    """Bounded LRU of padded ``(states, mask)`` batches keyed by the identities of their rows."""

    def __init__(self, maxsize: int = 8) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._entries: OrderedDict[tuple, tuple[tuple, torch.Tensor, torch.Tensor]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(
        self,
        rows: Sequence[tuple[torch.Tensor, torch.Tensor]],
        length: int,
        *,
        dtype: torch.dtype | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(R, length, D)`` states and ``(R, length)`` bool mask for ``rows`` of
        ``(states (L_i, D), mask (L_i,))``. The input list is not modified."""
        key = (tuple((id(s), id(m)) for s, m in rows), length, dtype)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[1], entry[2]
        self.misses += 1
        first = rows[0][0]
        out_dtype = dtype or first.dtype
        states = torch.zeros(
            len(rows), length, first.shape[1], dtype=out_dtype, device=first.device
        )
        mask = torch.zeros(len(rows), length, dtype=torch.bool, device=first.device)
        for i, (s, m) in enumerate(rows):
            n = s.shape[0]
            if n:
                states[i, :n].copy_(s)
                mask[i, :n].copy_(m)
        self._entries[key] = (tuple(rows), states, mask)
        if len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)
        return states, mask
