"""``tilted_plane_features``: rotated tri-plane (K-Planes / TILTED) feature interpolation.

The public function validates its inputs, picks a backend with ``triton_dispatch`` and either runs
the PyTorch reference (``grid_sample``; CPU, MPS, ``backend="torch"``) or the fused Triton kernels
through the custom op ``tomo_kplanes::tilted_plane_features`` (with a fake implementation and an
autograd formula, so it traces under ``torch.compile(fullgraph=True)``). Eager calls run the same
kernels through an ``autograd.Function`` (a custom op's dispatch costs more host time than its
launches), and a repeat call with the same kind of inputs reuses a cached plan: validation, the
backend choice and the launch arguments are resolved once per kind. See ``reference.py`` for the
axis conventions.
"""

from .dispatch import tilted_plane_features
from .reference import PLANE_AXES, rotate_points, tilted_plane_features_reference

__all__ = [
    "PLANE_AXES",
    "rotate_points",
    "tilted_plane_features",
    "tilted_plane_features_reference",
]
