"""Fused ops of tomo-kplanes, one folder per op."""

from .nearest_rotation import nearest_rotation
from .tilted_plane_features import tilted_plane_features

__all__ = ["nearest_rotation", "tilted_plane_features"]
