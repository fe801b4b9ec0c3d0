"""Fused ops of tomo-kplanes, one folder per op."""

from .tilted_plane_features import tilted_plane_features

__all__ = ["tilted_plane_features"]
