"""``nearest_rotation``: project free 3×3 matrices onto SO(3) (the model's learned rotations).

The public function validates, picks a backend with ``triton_dispatch`` and runs either the SVD
reference (CPU, ``backend="torch"``) or one tiny Triton program through the custom op
``tomo_kplanes::nearest_rotation``. The Triton path exists for the training step on CUDA, where the
SVD's host-side status check would block the CPU every step; see ``kernel.py`` for the method.
Eager calls run the kernels through an ``autograd.Function`` (no custom-op dispatch) and reuse a
plan per kind of call, so a training step pays about two launches for it.
"""

from .dispatch import nearest_rotation
from .reference import nearest_rotation_reference

__all__ = ["nearest_rotation", "nearest_rotation_reference"]
