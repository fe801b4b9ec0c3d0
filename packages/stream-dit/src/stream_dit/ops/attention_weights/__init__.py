"""The softmax weights of attention to a few keys (cross-attention to conditioning tokens), for a
caller that applies them to values it has already projected: the few-keys attention kernel
writing its probabilities. The declaration in :mod:`.op`, the launch in :mod:`.kernels`, the spec
in :mod:`.reference`."""

from __future__ import annotations

import torch

from .op import ATTENTION_WEIGHTS
from .reference import attention_weights_reference


def attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    *,
    scale: float,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    backend: str | None = None,
) -> torch.Tensor:
    """``softmax(scale·q·kᵀ)`` over each query's keys, ``(B, N, H, M)`` contiguous (flattening
    the last two gives one row per query: the weights of every head's keys side by side).

    Args:
        q: ``(B, N, H, d)`` queries (unit stride along ``d``; views are read in place).
        k: ``(B, M, Hkv, d)`` keys, ``M <= 128``, ``H`` a multiple of ``Hkv``.
        key_mask: optional ``(B, M)`` bool, True on the keys that exist.
        scale: the score scale (``d**-0.5`` usually).
        q_weight, k_weight, eps: optional ``(d,)`` weights of RMS norms applied to each query and
            key head as they are loaded.
        backend: see :func:`triton_dispatch.select_backend`.

    A query with no key gets zero weights (never NaN).

    Raises:
        ValueError / TypeError: naming the argument, for bad shapes, dtypes, layouts or more than
            128 keys.
    """
    return ATTENTION_WEIGHTS(q, k, key_mask, q_weight, k_weight, scale=scale, eps=eps,
                             backend=backend)  # fmt: skip


__all__ = ["attention_weights", "attention_weights_reference"]
