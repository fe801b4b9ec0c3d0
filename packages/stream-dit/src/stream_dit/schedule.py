"""Flow-matching timestep schedules, cached per (steps, shift, denoise)."""

from __future__ import annotations

import math
from functools import lru_cache


def shift_time(t: float, shift: float) -> float:
    """``t' = s·t / (1 + (s − 1)·t)``: ``s > 1`` spends more of the steps at high noise."""
    return shift * t / (1.0 + (shift - 1.0) * t)


@lru_cache(maxsize=256)
def flow_schedule(steps: int, shift: float = 1.0, denoise: float = 1.0) -> tuple[float, ...]:
    """Timesteps from noisy to clean, ``len = n + 1`` with ``n = max(1, round(steps·denoise))``.

    The full ``steps``-step schedule runs ``t = 1 … 0`` (shifted); partial denoise keeps its last
    ``n`` steps, so ``denoise=0.5`` starts from the schedule's midpoint and ends at ``t = 0``.

    Raises:
        ValueError: for ``steps < 1``, a non-positive or non-finite ``shift``, or ``denoise`` not
            in ``(0, 1]``.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if not (math.isfinite(shift) and shift > 0):
        raise ValueError(f"shift must be finite and > 0, got {shift!r}")
    if not (math.isfinite(denoise) and 0.0 < denoise <= 1.0):
        raise ValueError(f"denoise must be in (0, 1], got {denoise!r}")
    full = [shift_time(1.0 - i / steps, shift) for i in range(steps + 1)]
    n = max(1, round(steps * denoise))
    return tuple(full[steps - n :])
