"""Per-step curves: host-side sequences sampled by denoising progress.

A curve is a short sequence of floats spread over a request's steps (linear interpolation), so one
curve serves requests with any step count. Everything about a curve that the tick needs to branch on
(is it all zeros, all ones) is decided when the curve is made, never by reading device values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Curve:
    """Values over progress ``0 … 1`` of a request's steps."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("a curve needs at least one value")
        if not all(math.isfinite(v) for v in self.values):
            raise ValueError(f"curve values must be finite, got {list(self.values)}")

    @classmethod
    def of(cls, values: Curve | Sequence[float] | float | None, *, name: str) -> Curve | None:
        if values is None or isinstance(values, Curve):
            return values
        if isinstance(values, (int, float)) and not isinstance(values, bool):
            values = [float(values)]
        if isinstance(values, (str, bytes, bool)):
            raise TypeError(f"{name} must be a sequence of numbers, got {values!r}")
        try:
            items = list(values)
        except TypeError:
            raise TypeError(f"{name} must be a sequence of numbers, got {values!r}") from None
        # a bool or a string is not a number, though float() would take both
        if any(isinstance(v, (bool, str, bytes)) for v in items):
            raise TypeError(f"{name} must be a sequence of numbers, got {values!r}")
        try:
            floats = tuple(float(v) for v in items)
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be a sequence of numbers, got {values!r}") from None
        try:
            return cls(floats)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None

    def at(self, step: int, steps: int) -> float:
        """Value at step ``step`` of ``steps`` (0-based)."""
        if len(self.values) == 1:
            return self.values[0]
        pos = (step / max(steps - 1, 1)) * (len(self.values) - 1)
        lo = min(math.floor(pos), len(self.values) - 2)
        frac = pos - lo
        return self.values[lo] * (1.0 - frac) + self.values[lo + 1] * frac

    def is_constant(self, value: float) -> bool:
        return all(v == value for v in self.values)


def is_zero(curve: Curve | None) -> bool:
    return curve is None or curve.is_constant(0.0)


def is_one(curve: Curve | None) -> bool:
    return curve is None or curve.is_constant(1.0)
