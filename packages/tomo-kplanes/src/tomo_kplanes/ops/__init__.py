"""Fused ops of tomo-kplanes, one folder per op."""

from .nearest_rotation import nearest_rotation
from .plane_tv import plane_tv
from .ray_loss import ray_loss
from .tilted_plane_features import tilted_plane_features
from .tilted_plane_features_with_tv import tilted_plane_features_with_tv

__all__ = [
    "nearest_rotation",
    "plane_tv",
    "ray_loss",
    "tilted_plane_features",
    "tilted_plane_features_with_tv",
]
