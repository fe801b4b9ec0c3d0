"""Fused classifier-free guidance + Euler update of many rows in one launch: the public function
in :mod:`.dispatch`, the declaration in :mod:`.op`, the kernel in :mod:`.forward`, the spec in
:mod:`.reference`."""

from .dispatch import guided_euler_
from .reference import guided_euler_reference_

__all__ = ["guided_euler_", "guided_euler_reference_"]
