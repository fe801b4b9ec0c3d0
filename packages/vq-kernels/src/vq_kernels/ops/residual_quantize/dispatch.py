"""``residual_quantize``: the result type, the plan cache and the eager plans."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from triton_dispatch import uses_triton
from triton_dispatch.compile_ahead import backward_follows
from triton_dispatch.launch import PlanCache, call_key

from .op import (
    ResidualQuantizeFunction,
    residual_backward,
    residual_forward,
    residual_quantize_op,
)
from .validation import check_residual_quantize


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
    if not torch.compiler.is_compiling():
        key = call_key((x, codebooks), metric, commitment_weight, codebook_weight, backend)
        if key is not None:
            plan = _PLANS.get(
                key,
                lambda: _plan(x, codebooks, metric, commitment_weight, codebook_weight, backend),
            )
            return plan(x, codebooks)
    return _residual_quantize(x, codebooks, metric, commitment_weight, codebook_weight, backend)


_PLANS: PlanCache = PlanCache("vq_kernels.residual_quantize")


def _result(outputs, lead, dim, levels) -> ResidualQuantized:
    quantized, codes, level_codes, residuals, loss = outputs
    return ResidualQuantized(
        quantized.view(*lead, dim), codes.view(*lead, levels), loss, residuals[:levels], level_codes
    )


def _residual_quantize(x, codebooks, metric, commitment_weight, codebook_weight, backend):
    """The uncached path (traced calls, and calls the plan key cannot describe)."""
    chosen = check_residual_quantize(
        x, codebooks, metric, commitment_weight, codebook_weight, backend
    )
    dim, levels = x.shape[-1], codebooks.shape[0]
    outputs = residual_quantize_op(
        x.reshape(x.shape[:-1].numel(), dim), codebooks, metric, float(commitment_weight),
        float(codebook_weight), chosen,
    )  # fmt: skip
    return _result(outputs, x.shape[:-1], dim, levels)


def _plan(x, codebooks, metric, commitment_weight, codebook_weight, backend):
    """The eager plan of a validated call: the fused launch bound when it serves these sizes, the
    autograd node, the backward's kernel."""
    chosen = check_residual_quantize(
        x, codebooks, metric, commitment_weight, codebook_weight, backend
    )
    commitment_weight, codebook_weight = float(commitment_weight), float(codebook_weight)
    lead, dim = x.shape[:-1], x.shape[-1]
    levels, num_codes = codebooks.shape[:2]
    batch = math.prod(lead)
    numel = max(batch * dim, 1)
    dtype, device = x.dtype, x.device
    contiguous = x.is_contiguous()
    kernels = uses_triton(chosen) and dtype != torch.float64 and batch * dim > 0
    grad_plan = None
    forward = functools.partial(
        residual_forward, metric=metric, commitment_weight=commitment_weight,
        codebook_weight=codebook_weight, backend=chosen,
    )  # fmt: skip
    if kernels:
        from .kernels import ResidualGradPlan, fused_fits, residual_quantize_fused

        grad_plan = ResidualGradPlan(batch, dim, levels, device, 2.0 * commitment_weight / numel)
        if backward_follows(x, codebooks):
            grad_plan.compile_ahead(dtype)
        if fused_fits(batch, num_codes, levels, device):
            cast = codebooks.dtype != dtype
            contiguous_codebooks = codebooks.is_contiguous()
            scale = (commitment_weight + codebook_weight) / numel

            def forward(x2, codebooks):
                cb = codebooks.detach()
                if cast:
                    cb = cb.to(dtype)
                if not contiguous_codebooks:
                    cb = cb.contiguous()
                norms = torch.linalg.vector_norm(cb, dim=-1, dtype=torch.float32)
                return residual_quantize_fused(x2.detach(), cb, norms, metric, scale)

    backward = functools.partial(
        residual_backward, commitment_weight=commitment_weight, codebook_weight=codebook_weight,
        codebooks_shape=tuple(codebooks.shape), codebooks_dtype=codebooks.dtype,
        grad_plan=grad_plan,
    )  # fmt: skip

    def run(x, codebooks):
        x2 = x.view(batch, dim) if contiguous else x.reshape(batch, dim).contiguous()
        if torch.is_grad_enabled() and (x.requires_grad or codebooks.requires_grad):
            outputs = ResidualQuantizeFunction.apply(x2, codebooks, forward, backward)
        else:
            outputs = forward(x2, codebooks)
        return _result(outputs, lead, dim, levels)

    return run
