"""Each query head's values through its slice of the attention's output projection: with few
keys (cross-attention to conditioning tokens) ``weights @ (v·W_h)`` costs ``M / d`` of
``(weights @ v) @ W`` and the attention never writes its outputs. The declaration in :mod:`.op`,
the kernel in :mod:`.kernels`, the spec in :mod:`.reference`."""

from __future__ import annotations

import torch

from .op import HEAD_VALUES
from .reference import head_values_reference


def head_values(
    v: torch.Tensor, weight: torch.Tensor, *, heads: int, backend: str | None = None
) -> torch.Tensor:
    """``(B, H·M, D_out)``: row ``h·M + m`` of batch row ``b`` is value ``m`` of the key/value
    head query head ``h`` reads, times that head's slice of the output projection
    (``weight[:, h·d:(h+1)·d]ᵀ``). ``attention_weights(q, k, ...).flatten(2) @ head_values(v, W,
    heads=H)`` equals ``attention(q, k, v, ...).flatten(2) @ Wᵀ``.

    Args:
        v: ``(B, M, Hkv, d)`` values, ``M <= 128`` (unit stride along ``d``; views of a fused
            key/value projection are read in place).
        weight: ``(D_out, H·d)`` the output projection's weight, contiguous, ``v``'s dtype.
        heads: ``H``, the query heads (a multiple of ``Hkv``).
        backend: see :func:`triton_dispatch.select_backend`.

    Raises:
        ValueError / TypeError: naming the argument, for bad shapes, dtypes or layouts.
    """
    return HEAD_VALUES(v, weight, heads=heads, backend=backend)


__all__ = ["head_values", "head_values_reference"]
