"""Fused classifier-free guidance + Euler update of many rows in one launch."""

from .dispatch import guided_euler_
from .reference import guided_euler_reference_

__all__ = ["guided_euler_", "guided_euler_reference_"]
