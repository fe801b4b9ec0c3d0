"""MaxSim (late-interaction) scores: the public functions, on the padded and packed layouts.

The functions live in :mod:`.dispatch` (validation in :mod:`.validation`, eager plans in
:mod:`.plan`, the custom ops in :mod:`.op`); the kernels in :mod:`.forward`, :mod:`.backward` and
:mod:`.backward_plan`; the specification in :mod:`.reference`.
"""

from .backward_method import AUTO_LOWMEM_MIN_PAIRS, BACKWARD_METHODS, resolve_backward
from .dispatch import maxsim, maxsim_pairs, maxsim_unchecked, maxsim_varlen

__all__ = [
    "AUTO_LOWMEM_MIN_PAIRS",
    "BACKWARD_METHODS",
    "maxsim",
    "maxsim_pairs",
    "maxsim_unchecked",
    "maxsim_varlen",
    "resolve_backward",
]
