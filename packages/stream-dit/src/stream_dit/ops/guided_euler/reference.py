"""Specification of the fused CFG + Euler update, in plain PyTorch."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def guided_euler_reference_(
    state: torch.Tensor,
    velocity: torch.Tensor,
    slot_rows: Sequence[int],
    pos_rows: Sequence[int],
    neg_rows: Sequence[int],
    lengths: Sequence[int],
    guidance: Sequence[float],
    dt: Sequence[float],
) -> torch.Tensor:
    """For each row r: ``state[s, :L] += dt·(v_neg + g·(v_pos − v_neg))`` with ``s = slot_rows[r]``,
    ``v_pos = velocity[pos_rows[r], :L]``, ``v_neg = velocity[neg_rows[r], :L]``, ``L = lengths[r]``,
    computed in ``state``'s dtype (velocities upcast). Returns ``state``."""
    for s, p, q, n, g, h in zip(slot_rows, pos_rows, neg_rows, lengths, guidance, dt):
        vp = velocity[p, :n].to(state.dtype)
        vn = velocity[q, :n].to(state.dtype)
        x = state[s, :n]
        x.add_((vn + g * (vp - vn)) * h)
    return state


def guided_euler_rows_reference_(
    state: torch.Tensor, velocity: torch.Tensor, rows: torch.Tensor, params: torch.Tensor
) -> tuple:
    """:func:`guided_euler_reference_` on the device tables the declared op takes: ``rows``
    ``(4, R)`` int64 (slot, pos, neg, ``numel = L·C``) and ``params`` ``(2, R)`` float32
    (guidance, dt). Gathers and scatters on the tables' device, never reading them on the host.
    Updates ``state``; returns no output."""
    slot, pos, neg, numel = rows
    g, dt = params[:, :, None]
    width = min(state.shape[1], velocity.shape[1]) * state.shape[2]
    x, v = state.flatten(1)[:, :width], velocity.flatten(1)[:, :width]
    vp, vn, old = v[pos].to(state.dtype), v[neg].to(state.dtype), x[slot]
    inside = torch.arange(width, device=state.device) < numel[:, None]
    x[slot] = torch.where(inside, old + (vn + g * (vp - vn)) * dt, old)
    return ()
