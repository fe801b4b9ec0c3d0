"""``residual_quantize``: every level of a residual vector quantizer in one launch, with the
straight-through output, the stacked inputs of the EMA update and the training losses."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from triton_dispatch import uses_triton
from triton_dispatch.compile_ahead import backward_follows
from triton_dispatch.launch import PlanCache, call_key

from ..quantize import check_search
from .reference import residual_loss_reference, residual_quantize_reference

__all__ = ["ResidualQuantized", "residual_quantize"]


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


def _check_weight(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def _check(x, codebooks, metric, commitment_weight, codebook_weight, backend) -> str:
    """Every metadata check of :func:`residual_quantize`; returns the backend."""
    chosen = check_search(x, codebooks, metric, backend, name="codebooks", stacked=True)
    _check_weight("commitment_weight", commitment_weight)
    _check_weight("codebook_weight", codebook_weight)
    return chosen


def _forward(
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


def _backward(
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


class _ResidualQuantizeFunction(torch.autograd.Function):
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
_residual_quantize_op = torch.library.custom_op("vq_kernels::residual_quantize", mutates_args=())(
    _forward
)


@_residual_quantize_op.register_fake
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
    grad_x, grad_codebooks = _backward(
        grad_out, grad_loss, residuals, level_codes, need[0], need[1],
        commitment_weight=ctx.weights[0], codebook_weight=ctx.weights[1],
        codebooks_shape=ctx.codebooks_meta[0], codebooks_dtype=ctx.codebooks_meta[1],
    )  # fmt: skip
    return grad_x, grad_codebooks, None, None, None, None


_residual_quantize_op.register_autograd(_op_backward, setup_context=_setup_context)


def _result(outputs, lead, dim, levels) -> ResidualQuantized:
    quantized, codes, level_codes, residuals, loss = outputs
    return ResidualQuantized(
        quantized.view(*lead, dim), codes.view(*lead, levels), loss, residuals[:levels], level_codes
    )


def _residual_quantize(x, codebooks, metric, commitment_weight, codebook_weight, backend):
    """The uncached path (traced calls, and calls the plan key cannot describe)."""
    chosen = _check(x, codebooks, metric, commitment_weight, codebook_weight, backend)
    dim, levels = x.shape[-1], codebooks.shape[0]
    outputs = _residual_quantize_op(
        x.reshape(x.shape[:-1].numel(), dim), codebooks, metric, float(commitment_weight),
        float(codebook_weight), chosen,
    )  # fmt: skip
    return _result(outputs, x.shape[:-1], dim, levels)


def _plan(x, codebooks, metric, commitment_weight, codebook_weight, backend):
    """The eager plan of a validated call: the fused launch bound when it serves these sizes, the
    autograd node, the backward's kernel."""
    chosen = _check(x, codebooks, metric, commitment_weight, codebook_weight, backend)
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
        _forward, metric=metric, commitment_weight=commitment_weight,
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
        _backward, commitment_weight=commitment_weight, codebook_weight=codebook_weight,
        codebooks_shape=tuple(codebooks.shape), codebooks_dtype=codebooks.dtype,
        grad_plan=grad_plan,
    )  # fmt: skip

    def run(x, codebooks):
        x2 = x.view(batch, dim) if contiguous else x.reshape(batch, dim).contiguous()
        if torch.is_grad_enabled() and (x.requires_grad or codebooks.requires_grad):
            outputs = _ResidualQuantizeFunction.apply(x2, codebooks, forward, backward)
        else:
            outputs = forward(x2, codebooks)
        return _result(outputs, lead, dim, levels)

    return run
