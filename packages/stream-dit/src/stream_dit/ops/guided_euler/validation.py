"""The checks of a ``guided_euler_`` call: matching row lists, shapes, dtypes, layouts, one device
and rows in range."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from triton_dispatch import common_device


def check_rows(
    state: torch.Tensor,
    velocity: torch.Tensor,
    slot_rows: Sequence[int],
    pos_rows: Sequence[int],
    neg_rows: Sequence[int],
    lengths: Sequence[int],
    guidance: Sequence[float],
    dt: Sequence[float],
) -> None:
    """Raise ``ValueError`` / ``TypeError`` naming the first argument that does not fit."""
    n = len(slot_rows)
    if not (len(pos_rows) == len(neg_rows) == len(lengths) == len(guidance) == len(dt) == n):
        raise ValueError(
            "slot_rows, pos_rows, neg_rows, lengths, guidance and dt must have one entry per row"
        )
    if state.dim() != 3 or velocity.dim() != 3:
        raise ValueError(
            f"state must be (S, T, C) and velocity (R, T, C); got {tuple(state.shape)} and {tuple(velocity.shape)}"
        )
    if state.shape[2] != velocity.shape[2]:
        raise ValueError(
            f"channel mismatch: state C={state.shape[2]}, velocity C={velocity.shape[2]}"
        )
    if state.dtype != torch.float32:
        raise TypeError(f"state must be float32, got {state.dtype}")
    if not velocity.is_floating_point():
        raise TypeError(f"velocity must be floating point, got {velocity.dtype}")
    if state.stride(1) != state.shape[2] or state.stride(2) != 1:
        raise ValueError("state rows must be contiguous (T, C) blocks")
    if state.shape[0] > 1 and state.stride(0) < state.shape[1] * state.shape[2]:
        # an expanded (stride-0) or otherwise overlapping state would alias the rows it updates
        raise ValueError(
            f"state rows overlap in memory (strides {state.stride()}); it is updated in place, "
            "pass a tensor whose (T, C) rows are distinct"
        )
    if velocity.stride(1) != velocity.shape[2] or velocity.stride(2) != 1:
        raise ValueError("velocity rows must be contiguous (T, C) blocks")
    common_device([state, velocity], names=["state", "velocity"])
    for name, rows, tensor, bound in (
        ("slot_rows", slot_rows, "state", state.shape[0]),
        ("pos_rows", pos_rows, "velocity", velocity.shape[0]),
        ("neg_rows", neg_rows, "velocity", velocity.shape[0]),
    ):
        if any(not 0 <= r < bound for r in rows):
            raise ValueError(
                f"{name} must lie in [0, {bound}) (the rows of {tensor}), got {list(rows)}"
            )
    limit = min(state.shape[1], velocity.shape[1])
    if any(not 0 <= length <= limit for length in lengths):
        raise ValueError(f"lengths must lie in [0, {limit}], got {list(lengths)}")
    if not all(math.isfinite(v) for v in (*guidance, *dt)):
        raise ValueError("guidance and dt must be finite")
    if len(set(slot_rows)) != n:
        raise ValueError("slot_rows must not repeat (each row is updated in place)")
