"""``residual_quantize``'s forward and backward on every backend, as the custom op
``vq_kernels::residual_quantize`` (fake and autograd included) and as the eager autograd node."""

from __future__ import annotations

import torch

from triton_dispatch import uses_triton

from .reference import residual_loss_reference, residual_quantize_reference


def residual_forward(
    x: torch.Tensor,
    codebooks: torch.Tensor,
    metric: str,
    commitment_weight: float,
    codebook_weight: float,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(quantized, codes, level_codes, residuals, loss)`` of ``x (N, D)`` on any backend, without
    autograd."""
    (batch, dim), levels = x.shape, codebooks.shape[0]
    weight = commitment_weight + codebook_weight
    if batch == 0:
        return (
            x.new_empty(0, dim),
            x.new_empty(0, levels, dtype=torch.int64),
            x.new_empty(levels, 0, dtype=torch.int64),
            x.new_empty(levels + 1, 0, dim),
            x.new_zeros((), dtype=torch.promote_types(x.dtype, torch.float32)),
        )
    x = x.detach()
    cb = codebooks.detach().to(x.dtype)
    search = None
    if uses_triton(backend) and x.dtype != torch.float64 and dim > 0:
        from ..quantize.kernels import nearest_code
        from .kernels import fused_fits, residual_quantize_fused

        x, cb = x.contiguous(), cb.contiguous()
        # One launch for the per-code terms of every level, as quantize computes them.
        norms = torch.linalg.vector_norm(cb, dim=-1, dtype=torch.float32)
        if fused_fits(batch, cb.shape[1], levels, x.device):
            return residual_quantize_fused(x, cb, norms, metric, weight / max(batch * dim, 1))

        def search(residual, level):
            return nearest_code(residual, cb[level], norms[level], metric)

    quantized, codes, residuals = residual_quantize_reference(x, cb, metric, search=search)
    loss = residual_loss_reference(residuals, weight)
    return quantized, codes, codes.T.contiguous(), residuals, loss


def residual_backward(
    grad_out: torch.Tensor | None,
    grad_loss: torch.Tensor | None,
    residuals: torch.Tensor,
    level_codes: torch.Tensor,
    need_x: bool,
    need_codebooks: bool,
    *,
    commitment_weight: float,
    codebook_weight: float,
    codebooks_shape: tuple[int, int, int],
    codebooks_dtype: torch.dtype,
    grad_plan=None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of ``x`` and of the codebooks (see ``reference.py`` for the formulas).
    ``grad_plan``: the one-launch kernel for ``x``'s gradient (else PyTorch ops, which trace)."""
    levels, num_codes, dim = codebooks_shape
    numel = max(residuals[0].numel(), 1)
    grad_x = grad_codebooks = None
    if need_x:
        grad_x = grad_out
        if grad_loss is not None and commitment_weight != 0:
            if grad_plan is not None:
                grad_x = grad_plan(grad_out, grad_loss, residuals, residuals[0])
            else:
                acc = torch.promote_types(residuals.dtype, torch.float32)
                total = residuals[1:].to(acc).sum(0)
                grad = (2.0 * commitment_weight / numel) * grad_loss.to(acc) * total
                if grad_out is not None:
                    grad = grad + grad_out.to(acc)
                grad_x = grad.to(residuals.dtype)
    if need_codebooks and grad_loss is not None and codebook_weight != 0:
        acc = torch.promote_types(residuals.dtype, torch.float32)
        batch = residuals.shape[1]
        offsets = torch.arange(levels, device=level_codes.device)[:, None] * num_codes
        sums = torch.zeros(levels * num_codes, dim, device=residuals.device, dtype=acc)
        sums.index_add_(
            0,
            (level_codes + offsets).reshape(-1),
            residuals[1:].reshape(levels * batch, dim).to(acc),
        )
        scale = (-2.0 * codebook_weight / numel) * grad_loss.to(acc)
        grad_codebooks = (sums * scale).view(codebooks_shape).to(codebooks_dtype)
    return grad_x, grad_codebooks


class ResidualQuantizeFunction(torch.autograd.Function):
    """The eager autograd node: the plan's forward and backward, no dispatcher in between."""

    @staticmethod
    def forward(ctx, x, codebooks, forward, backward):
        quantized, codes, level_codes, residuals, loss = forward(x, codebooks)
        ctx.mark_non_differentiable(codes, level_codes, residuals)
        ctx.save_for_backward(residuals, level_codes)
        ctx.backward_fn = backward
        ctx.set_materialize_grads(False)
        return quantized, codes, level_codes, residuals, loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, _codes, _level_codes, _residuals, grad_loss):
        residuals, level_codes = ctx.saved_tensors
        need_x, need_codebooks = ctx.needs_input_grad[:2]
        grad_x, grad_codebooks = ctx.backward_fn(
            grad_out, grad_loss, residuals, level_codes, need_x, need_codebooks
        )
        return grad_x, grad_codebooks, None, None


# The traced path: a custom op with a fake and an autograd formula, so that the search runs inside
# torch.compile(fullgraph=True) without a graph break.
residual_quantize_op = torch.library.custom_op("vq_kernels::residual_quantize", mutates_args=())(
    residual_forward
)


@residual_quantize_op.register_fake
def _(x, codebooks, metric, commitment_weight, codebook_weight, backend):
    (batch, dim), levels = x.shape, codebooks.shape[0]
    return (
        x.new_empty(batch, dim),
        x.new_empty(batch, levels, dtype=torch.int64),
        x.new_empty(levels, batch, dtype=torch.int64),
        x.new_empty(levels + 1, batch, dim),
        x.new_empty((), dtype=torch.promote_types(x.dtype, torch.float32)),
    )


def _setup_context(ctx, inputs, output):
    _, codebooks, _, commitment_weight, codebook_weight, _ = inputs
    ctx.save_for_backward(output[3], output[2])
    ctx.weights = (commitment_weight, codebook_weight)
    ctx.codebooks_meta = (tuple(codebooks.shape), codebooks.dtype)


def _op_backward(ctx, grad_out, _codes, _level_codes, _residuals, grad_loss):
    residuals, level_codes = ctx.saved_tensors
    need = getattr(ctx, "needs_input_grad", (True, True))
    grad_x, grad_codebooks = residual_backward(
        grad_out, grad_loss, residuals, level_codes, need[0], need[1],
        commitment_weight=ctx.weights[0], codebook_weight=ctx.weights[1],
        codebooks_shape=ctx.codebooks_meta[0], codebooks_dtype=ctx.codebooks_meta[1],
    )  # fmt: skip
    return grad_x, grad_codebooks, None, None, None, None


residual_quantize_op.register_autograd(_op_backward, setup_context=_setup_context)
