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
