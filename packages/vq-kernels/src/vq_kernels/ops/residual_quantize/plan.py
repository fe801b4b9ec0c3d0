"""The plans of ``vq_kernels::residual_quantize``: per kind of call, the fused launch (or the
one-level search level by level) and the backward's kernel, chosen once."""

from __future__ import annotations

import torch

from triton_dispatch import select_backend, uses_triton
from triton_dispatch.compile_ahead import backward_follows

from ..quantize.kernels import nearest_code
from . import kernels
from .reference import residual_loss_reference, residual_quantize_reference


class ResidualBackward:
    """The gradients of ``x`` and of the codebooks (see ``reference.py`` for the formulas), from
    the saved residuals ``(L + 1, N, D)`` and level-major codes ``(L, N)``. ``grad_plan``: the
    one-launch kernel for ``x``'s gradient (else PyTorch ops)."""

    def __init__(self, codebooks_shape, codebooks_dtype, commitment_weight, codebook_weight,
                 grad_plan=None):  # fmt: skip
        self.codebooks_shape, self.codebooks_dtype = tuple(codebooks_shape), codebooks_dtype
        self.commitment_weight, self.codebook_weight = commitment_weight, codebook_weight
        self.grad_plan = grad_plan

    def backward(self, grad_out, grad_loss, residuals, level_codes, needs):
        levels, num_codes, dim = self.codebooks_shape
        numel = max(residuals[0].numel(), 1)
        grad_x = grad_codebooks = None
        if needs[0]:
            grad_x = grad_out
            if grad_loss is not None and self.commitment_weight != 0:
                if self.grad_plan is not None:
                    grad_x = self.grad_plan(grad_out, grad_loss, residuals, residuals[0])
                else:
                    acc = torch.promote_types(residuals.dtype, torch.float32)
                    total = residuals[1:].to(acc).sum(0)
                    grad = (2.0 * self.commitment_weight / numel) * grad_loss.to(acc) * total
                    if grad_out is not None:
                        grad = grad + grad_out.to(acc)
                    grad_x = grad.to(residuals.dtype)
        if needs[1] and grad_loss is not None and self.codebook_weight != 0:
            acc = torch.promote_types(residuals.dtype, torch.float32)
            batch = residuals.shape[1]
            offsets = torch.arange(levels, device=level_codes.device)[:, None] * num_codes
            sums = torch.zeros(levels * num_codes, dim, device=residuals.device, dtype=acc)
            sums.index_add_(
                0,
                (level_codes + offsets).reshape(-1),
                residuals[1:].reshape(levels * batch, dim).to(acc),
            )
            scale = (-2.0 * self.codebook_weight / numel) * grad_loss.to(acc)
            grad_codebooks = (sums * scale).view(self.codebooks_shape).to(self.codebooks_dtype)
        return grad_x, grad_codebooks


class ResidualSearch(ResidualBackward):
    """One kind of residual search on the kernels: x ``(N, D)``, ``N·D > 0``, not float64."""

    def __init__(self, x, codebooks, metric, commitment_weight, codebook_weight):
        (batch, dim), (levels, num_codes, _) = x.shape, codebooks.shape
        numel = batch * dim
        grad_plan = kernels.ResidualGradPlan(
            batch, dim, levels, x.device, 2.0 * commitment_weight / numel
        )
        if backward_follows(x, codebooks):
            grad_plan.compile_ahead(x.dtype)
        super().__init__(
            codebooks.shape, codebooks.dtype, commitment_weight, codebook_weight, grad_plan
        )
        self.metric, self.dtype = metric, x.dtype
        self.weight = commitment_weight + codebook_weight
        self.scale = self.weight / numel
        self.copy_x = not x.is_contiguous()
        self.cast = codebooks.dtype != x.dtype
        self.copy_codebooks = not codebooks.is_contiguous()
        self.fused = kernels.fused_fits(batch, num_codes, levels, x.device)

    def forward(self, x, codebooks):
        """``(quantized, codes, level_codes, residuals, loss)``."""
        x = x.detach()
        if self.copy_x:
            x = x.contiguous()
        cb = codebooks.detach()
        if self.cast:
            cb = cb.to(self.dtype)
        if self.copy_codebooks:
            cb = cb.contiguous()
        # One launch for the per-code terms of every level, as quantize computes them.
        norms = torch.linalg.vector_norm(cb, dim=-1, dtype=torch.float32)
        if self.fused:
            return kernels.residual_quantize_fused(x, cb, norms, self.metric, self.scale)

        def search(residual, level):
            return nearest_code(residual, cb[level], norms[level], self.metric)

        quantized, codes, residuals = residual_quantize_reference(x, cb, self.metric, search=search)
        loss = residual_loss_reference(residuals, self.weight)
        return quantized, codes, codes.T.contiguous(), residuals, loss


def residual_plan(call) -> ResidualSearch | None:
    """The plan of a validated call, or ``None`` where the reference runs it (float64, empty
    inputs)."""
    x = call["x"]
    if x.dtype == torch.float64 or x.numel() == 0:
        return None
    return ResidualSearch(
        x, call["codebooks"], call["metric"], call["commitment_weight"], call["codebook_weight"]
    )


def residual_backward_plan(named) -> ResidualBackward:
    """The backward op's plan, from the saved residuals, the settings and the codebooks' shape
    and dtype: the kernel for ``x``'s gradient where the forward would run kernels."""
    residuals = named["residuals"]
    levels, batch, dim = residuals.shape[0] - 1, residuals.shape[1], residuals.shape[2]
    commitment_weight = named["commitment_weight"]
    grad_plan = None
    kernels_run = uses_triton(select_backend(device=residuals.device))
    if kernels_run and residuals.dtype != torch.float64 and batch * dim > 0:
        coef = 2.0 * commitment_weight / (batch * dim)
        grad_plan = kernels.ResidualGradPlan(batch, dim, levels, residuals.device, coef)
    return ResidualBackward(
        named["codebooks_shape"], named["codebooks_dtype"], commitment_weight,
        named["codebook_weight"], grad_plan,
    )  # fmt: skip
