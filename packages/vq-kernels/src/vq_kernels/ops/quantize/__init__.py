"""``quantize``: the nearest code(s) of each row, with distance and argmin fused (no ``(B, K)``)."""

from .dispatch import quantize
from .reference import METRICS
from .validation import check_search

__all__ = ["METRICS", "check_search", "quantize"]
