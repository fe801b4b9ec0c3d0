"""``plane_tv``: the smoothness prior of feature planes, ``mean(Δ_H²) + mean(Δ_W²)``.

The public function validates, picks a backend with ``triton_dispatch`` and runs either the
PyTorch reference (CPU, ``backend="torch"``) or the Triton kernels: two launches for the value
(per-block partial sums, then one program that adds them, so the result does not depend on the
order atomics land in) and one pointwise launch for the gradient. Eager calls run them through an
``autograd.Function``; under ``torch.compile`` the same kernels run as the custom op
``tomo_kplanes::plane_tv`` (fake and autograd registrations included). Repeat calls with the same
kind of planes reuse a cached plan: validation and the backend choice run once per kind.
"""

from .dispatch import plane_tv
from .reference import plane_tv_reference

__all__ = ["plane_tv", "plane_tv_reference"]
