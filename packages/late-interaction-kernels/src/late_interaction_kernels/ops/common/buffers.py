"""Output buffers of the kernel launchers.

Tests set :data:`POISON_OUTPUTS` so every buffer a kernel should fill starts as NaN (or the integer
minimum): an element a kernel skips then shows up instead of passing with a leftover value.
"""

from __future__ import annotations

import torch

POISON_OUTPUTS = False


def output_buffer(shape, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    out = torch.empty(shape, dtype=dtype, device=device)
    if POISON_OUTPUTS:
        from triton_dispatch.testing import poison_

        poison_(out)
    return out
