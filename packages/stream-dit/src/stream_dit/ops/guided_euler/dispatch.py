"""``guided_euler_``: the host row lists checked and turned into device tables, then the declared
op (:data:`.op.GUIDED_EULER`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .op import GUIDED_EULER


def _pinned(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    host = torch.tensor(values, dtype=dtype)
    # traced (torch.compile) the lists are constants of the graph; pinning has no fake kernel
    if device.type == "cuda" and not torch.compiler.is_compiling():
        # a fresh pinned tensor each call: the caching host allocator keeps it alive until the
        # asynchronous copy has been consumed, so no host wait is needed
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def _check_rows(state, velocity, slot_rows, pos_rows, neg_rows, lengths, guidance, dt) -> None:
    """The host lists' checks, on every call (they are values); the tensors' own checks are the
    declaration's, once per kind of call."""
    n = len(slot_rows)
    if not (len(pos_rows) == len(neg_rows) == len(lengths) == len(guidance) == len(dt) == n):
        raise ValueError(
            "slot_rows, pos_rows, neg_rows, lengths, guidance and dt must have one entry per row"
        )
    if not all(math.isfinite(v) for v in (*guidance, *dt)):
        raise ValueError("guidance and dt must be finite")
    if len(set(slot_rows)) != n:
        raise ValueError("slot_rows must not repeat (each row is updated in place)")
    if not all(isinstance(t, torch.Tensor) and t.dim() == 3 for t in (state, velocity)):
        GUIDED_EULER.validate((state, velocity, None, None))  # raises, naming the tensor
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
    _check_rows(state, velocity, slot_rows, pos_rows, neg_rows, lengths, guidance, dt)
    channels, device = state.shape[2], state.device
    key = (tuple(slot_rows), tuple(pos_rows), tuple(neg_rows), tuple(lengths), channels, device)
    rows = rows_cache.get(key) if rows_cache is not None else None
    if rows is None:
        numel = [length * channels for length in lengths]
        rows = _pinned(
            [list(slot_rows), list(pos_rows), list(neg_rows), numel], torch.int64, device
        )
        if rows_cache is not None:
            if len(rows_cache) > 64:
                rows_cache.pop(next(iter(rows_cache)))
            rows_cache[key] = rows
    params = _pinned([list(guidance), list(dt)], torch.float32, device)
    GUIDED_EULER(state, velocity, rows, params, backend=backend)
    return state
