"""The dead-code thresholds of ``ema_update_`` and its opt-in value check of the codes."""

from __future__ import annotations

import torch

#: Dead-code thresholds used when ``dead_threshold`` is left at its default: steps without an
#: assignment for ``active_only``, EMA cluster size for ``decay_all``.
DEFAULT_THRESHOLDS = {"active_only": 20, "decay_all": 2.0}

# The default of ``dead_threshold``: None already means "no restarts", so "the threshold of the
# chosen semantics" needs a value of its own.
DEFAULT_FOR_SEMANTICS = object()


def check_code_range(codes: torch.Tensor, num_codes: int) -> None:
    """The opt-in value check (reads two numbers back: a device sync on CUDA)."""
    if codes.numel() > 0:
        low, high = int(codes.min()), int(codes.max())
        if low < 0 or high >= num_codes:
            raise ValueError(
                f"codes must lie in [0, K) = [0, {num_codes}); got values in [{low}, {high}]"
            )
