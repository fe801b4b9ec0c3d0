"""``residual_quantize``: the result type and the public function over the declared op
(``op.py``), which flattens ``x``'s leading dimensions."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._validation import rows_of
from .op import RESIDUAL_QUANTIZE


class ResidualQuantized(NamedTuple):
    """What :func:`residual_quantize` returns (``N`` rows: the product of ``x``'s leading dims).

    Attributes:
        quantized: ``(..., D)`` straight-through output ``x + (Σ_l q_l − x)``: the value of the
            quantized vector, the gradient of the identity to ``x``.
        codes: ``(..., L)`` int64, level ``l``'s code of each row.
        loss: 0-d fp32 (fp64 for fp64 ``x``): ``(commitment_weight + codebook_weight) ·
            Σ_l mean((r_l − q_l)²)``.
        inputs: ``(L, N, D)`` in ``x``'s dtype, the residual ``r_l`` entering each level, detached:
            the ``x`` of :func:`vq_kernels.ema_update_` for stacked codebooks.
        level_codes: ``(L, N)`` int64, the codes level-major: the ``codes`` of that update.
    """

    quantized: torch.Tensor
    codes: torch.Tensor
    loss: torch.Tensor
    inputs: torch.Tensor
    level_codes: torch.Tensor


def residual_quantize(
    x: torch.Tensor,
    codebooks: torch.Tensor,
    *,
    metric: str = "l2",
    commitment_weight: float = 1.0,
    codebook_weight: float = 0.0,
    backend: str | None = None,
) -> ResidualQuantized:
    """Residual quantization of ``x (..., D)`` through ``codebooks (L, K, D)``.

    Level ``l`` takes the nearest code ``c_l`` (as :func:`vq_kernels.quantize`: ``metric``, ties to
    the lowest index, a row holding NaN maps to code 0) of the residual ``r_l`` (``r_0 = x``) and
    leaves ``r_{l+1} = r_l − q_l``, ``q_l = codebooks[l, c_l]`` cast to ``x``'s dtype; every step is
    rounded to ``x``'s dtype as a per-level PyTorch loop rounds it (see ``reference.py``).

    The loss trains a quantizer: ``commitment_weight · Σ_l mean((r_l − sg(q_l))²)`` gives ``x`` the
    gradient ``2·w / (N·D) · Σ_l r_{l+1}``, ``codebook_weight · Σ_l mean((q_l − sg(r_l))²)`` gives the
    codebooks theirs (a learned codebook; leave it 0 for EMA codebooks). ``quantized`` passes its
    upstream gradient to ``x`` unchanged, and nothing else is differentiable.

    On CUDA (fp32, fp16, bf16) one Triton launch runs every level (plus one norm launch, and one
    small reduction for the loss); when a small batch meets a large codebook the search runs level
    by level with the one-level kernel instead (K split over the GPU). The backward is one
    pointwise launch. fp64 and the ``"torch"`` backend run the reference. Nothing synchronises
    with the host, so a training step around it can be captured as a CUDA graph.
    """
    flat = rows_of(x)
    quantized, codes, level_codes, residuals, loss = RESIDUAL_QUANTIZE(
        flat, codebooks, metric=metric, commitment_weight=commitment_weight,
        codebook_weight=codebook_weight, backend=backend,
    )  # fmt: skip
    levels = level_codes.shape[0]
    if flat is not x:
        quantized, codes = quantized.view_as(x), codes.view(*x.shape[:-1], levels)
    return ResidualQuantized(quantized, codes, loss, residuals[:levels], level_codes)
