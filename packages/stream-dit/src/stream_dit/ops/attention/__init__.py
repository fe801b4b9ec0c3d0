"""Attention with grouped key/value heads, a key-padding mask and an optional sliding window, as
one flash-attention kernel that skips the key blocks outside the window. The declaration in
:mod:`.op`, the kernel in :mod:`.kernels`, the spec in :mod:`.reference`."""

from __future__ import annotations

import torch

from .op import ATTENTION
from .reference import attention_reference


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    *,
    scale: float,
    window: int = -1,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    backend: str | None = None,
) -> torch.Tensor:
    """``softmax(scale·q·kᵀ)·v`` over the keys each query may attend, ``(B, N, H, d)``
    contiguous (flattening the heads gives the output projection's input).

    Args:
        q: ``(B, N, H, d)`` queries (any strides with unit stride along ``d``: views of a fused
            QKV projection are read in place).
        k, v: ``(B, M, Hkv, d)`` keys and values, ``H`` a multiple of ``Hkv``.
        key_mask: optional ``(B, M)`` bool, True on the keys that exist.
        scale: the score scale (``d**-0.5`` usually).
        window: ``>= 0``: query ``i`` attends keys ``j`` with ``|i − j| <= window`` only; ``-1``:
            no window.
        q_weight, k_weight, eps: optional ``(d,)`` weights of RMS norms applied to each query
            head and each key head as they are loaded (QK-norm attention without a separate
            pass over them; the keys are normalised once per query block, so this suits few keys).
        backend: see :func:`triton_dispatch.select_backend`.

    A query with no key to attend gets zeros (never NaN).

    Raises:
        ValueError / TypeError: naming the argument, for bad shapes, dtypes or layouts.
    """
    return ATTENTION(q, k, v, key_mask, q_weight, k_weight, scale=scale, window=window, eps=eps,
                     backend=backend)  # fmt: skip


__all__ = ["attention", "attention_reference"]
