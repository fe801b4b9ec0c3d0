"""``guided_euler_``: validation, the backend choice, and the launch with its row tables."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from triton_dispatch import select_backend, uses_triton

from .reference import guided_euler_reference_
from .validation import check_rows


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
    check_rows(state, velocity, slot_rows, pos_rows, neg_rows, lengths, guidance, dt)
    if len(slot_rows) == 0:
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
