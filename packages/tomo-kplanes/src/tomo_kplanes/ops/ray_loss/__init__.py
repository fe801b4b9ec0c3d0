"""``ray_loss``: the reconstruction objective from the field's densities in one fused pass.

From the raw densities of a step's field call (the ``B·S`` ray samples, then the ``4·M`` volume-TV
taps) it applies the hard constraints to the ray samples, integrates each ray, and returns the
mean squared error against the measured line integrals plus the weighted volume TV of the taps and
the weighted plane TV: the ~30 pointwise launches and their backward of the PyTorch formulation
(``reference.py``, the specification and the CPU path) become two forward launches and one
backward launch. Eager calls run the kernels through an ``autograd.Function``; under
``torch.compile`` they run as the custom op ``tomo_kplanes::ray_loss``. Everything that depends on
the arguments' metadata (checks, backend, sizes, grids) is resolved once per kind of call.
"""

from .dispatch import ray_loss
from .reference import apply_constraints, ray_loss_reference, volume_tv_from_taps

__all__ = ["apply_constraints", "ray_loss", "ray_loss_reference", "volume_tv_from_taps"]
