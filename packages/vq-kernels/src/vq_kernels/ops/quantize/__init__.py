"""``quantize``: the nearest code(s) of each row, with distance and argmin fused (no ``(B, K)``)."""

from .dispatch import quantize
from .reference import METRICS

__all__ = ["METRICS", "quantize"]
