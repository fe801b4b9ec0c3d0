"""MaxSim (late-interaction) scores: the public functions, on the padded and packed layouts.

The functions live in :mod:`.dispatch`, the declaration in :mod:`.op`, its host plans in
:mod:`.plan` (forward) and :mod:`.backward_plan`, the kernels in :mod:`.forward` and
:mod:`.backward`, the specification in :mod:`.reference`.
"""

from .dispatch import maxsim, maxsim_pairs, maxsim_unchecked, maxsim_varlen
from .routing import AUTO_LOWMEM_MIN_PAIRS, BACKWARD_METHODS, resolve_backward

__all__ = [
    "AUTO_LOWMEM_MIN_PAIRS",
    "BACKWARD_METHODS",
    "maxsim",
    "maxsim_pairs",
    "maxsim_unchecked",
    "maxsim_varlen",
    "resolve_backward",
]
