"""How the kernels compute their dot products per dtype, and the norm floor of normalised tokens."""

from __future__ import annotations

import torch

from triton_dispatch import interpreter_enabled

#: ``torch.nn.functional.normalize``'s floor on a token's norm.
NORM_EPS = 1e-12


def dot_settings(dtype: torch.dtype) -> tuple[bool, bool]:
    """``(upcast, ieee)``: bf16 dots are computed wrongly by the interpreter, so it upcasts; fp32
    uses IEEE products (TF32 would cost ~1e-3 relative error)."""
    upcast = interpreter_enabled() and dtype == torch.bfloat16
    return upcast, dtype == torch.float32
