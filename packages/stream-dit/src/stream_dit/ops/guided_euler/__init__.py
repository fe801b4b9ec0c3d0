"""Fused classifier-free guidance + Euler update of many rows in one launch."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from triton_dispatch import common_device, select_backend, uses_triton

from .reference import guided_euler_reference_

__all__ = ["guided_euler_", "guided_euler_reference_"]


def _pinned(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    host = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        # a fresh pinned tensor each call: the caching host allocator keeps it alive until the
        # asynchronous copy has been consumed, so no host wait is needed
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def guided_euler_(
    state: torch.Tensor,
    velocity: torch.Tensor,
    slot_rows: Sequence[int],
    pos_rows: Sequence[int],
    neg_rows: Sequence[int],
    lengths: Sequence[int],
    guidance: Sequence[float],
    dt: Sequence[float],
    *,
    backend: str | None = None,
    rows_cache: dict | None = None,
) -> torch.Tensor:
    """In place, for each row r: ``state[slot_rows[r], :lengths[r]] += dt[r]·(v_neg + g[r]·(v_pos −
    v_neg))`` with ``v_pos``/``v_neg`` the rows ``pos_rows[r]``/``neg_rows[r]`` of ``velocity``.

    Args:
        state: ``(S, T_s, C)`` float32 latents, rows contiguous (updated in place).
        velocity: ``(R, T_v, C)`` float32/bf16/fp16 model outputs, rows contiguous.
        slot_rows, pos_rows, neg_rows, lengths, guidance, dt: host sequences of equal length.
        backend: see :func:`triton_dispatch.select_backend`.
        rows_cache: optional dict the caller keeps across calls; the index tensor of a row pattern
            seen before is reused instead of copied to the device again.

    Raises:
        ValueError / TypeError: for mismatched lengths, out-of-range rows, bad shapes or dtypes.
    """
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
    if n == 0:
        return state
    chosen = select_backend(state, velocity, backend=backend)
    if not uses_triton(chosen):
        return guided_euler_reference_(
            state, velocity, slot_rows, pos_rows, neg_rows, lengths, guidance, dt
        )

    from .forward import guided_euler_triton_

    channels = state.shape[2]
    key = (tuple(slot_rows), tuple(pos_rows), tuple(neg_rows), tuple(lengths))
    rows = rows_cache.get(key) if rows_cache is not None else None
    if rows is None:
        numel = [length * channels for length in lengths]
        rows = _pinned(
            [list(slot_rows), list(pos_rows), list(neg_rows), numel], torch.int64, state.device
        )
        if rows_cache is not None:
            if len(rows_cache) > 64:
                rows_cache.pop(next(iter(rows_cache)))
            rows_cache[key] = rows
    params = _pinned([list(guidance), list(dt)], torch.float32, state.device)
    block = 256 if chosen == "interpret" else 1024
    return guided_euler_triton_(state, velocity, rows, params, max(lengths) * channels, block)
