"""``tilted_plane_features_with_tv``: the features of ``tilted_plane_features`` and the
``plane_tv`` of the same planes, from one autograd node.

A training step differentiates both with respect to the planes. Run apart, the features' backward
fills a zero buffer for its atomics, the plane TV's backward writes a second plane-sized gradient,
and autograd adds the two: a memset, then an add that reads two plane-sized tensors and writes one.
Here the plane TV's backward kernel writes its gradient into the buffer and the features' backward
adds its atomics on top, so the planes' gradient costs one plane-sized write instead.

The kernels are the two ops' own. The values are theirs; the planes' gradient is theirs up to the
order of the fp32 additions. Where the fold cannot apply it is the two ops side by side: their
references on the PyTorch backend, their kernels with the two plane gradients added for a plane
layout one of them would copy first. The op is declared once (``op.py``): eager calls run an
``autograd.Function`` over cached plans; under ``torch.compile`` the custom op
``tomo_kplanes::tilted_plane_features_with_tv`` (fake and autograd registrations included).
"""

from .dispatch import tilted_plane_features_with_tv
from .reference import tilted_plane_features_with_tv_reference

__all__ = ["tilted_plane_features_with_tv", "tilted_plane_features_with_tv_reference"]
