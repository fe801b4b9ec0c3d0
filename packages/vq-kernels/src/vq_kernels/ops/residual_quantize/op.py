"""``residual_quantize``'s declaration: from it ``triton_dispatch`` derives the custom ops
``vq_kernels::residual_quantize`` and ``..._backward`` (fakes and autograd included), the eager
autograd path, the plan cache, the reference route and the argument checks."""

from __future__ import annotations

import math

import torch

from triton_dispatch.declaration import OpDeclaration, SettingSpec, TensorSpec

from .._validation import FLOAT_INPUTS
from ..quantize.op import METRIC, check_same_dim
from .reference import residual_outputs_reference


def _weight(name: str, default: float) -> SettingSpec:
    return SettingSpec(name, float, default, valid=math.isfinite, expected="finite")


def _plan(call):
    from .plan import residual_plan

    return residual_plan(call)


def _backward_plan(named):
    from .plan import residual_backward_plan

    return residual_backward_plan(named)


def _fake(x, codebooks, **settings):
    (batch, dim), levels = x.shape, codebooks.shape[0]
    return (
        x.new_empty(batch, dim),
        x.new_empty(batch, levels, dtype=torch.int64),
        x.new_empty(levels, batch, dtype=torch.int64),
        x.new_empty(levels + 1, batch, dim),
        x.new_empty((), dtype=torch.promote_types(x.dtype, torch.float32)),
    )


def _backward_fake(grad_out, grad_loss, residuals, level_codes, needs, **settings):
    return (
        residuals.new_empty(residuals.shape[1:]),
        residuals.new_empty(settings["codebooks_shape"], dtype=settings["codebooks_dtype"]),
    )


RESIDUAL_QUANTIZE = OpDeclaration(
    "vq_kernels::residual_quantize",
    inputs=[
        # the plan copies a strided x or codebooks per call: one plan serves every layout
        TensorSpec(
            "x", FLOAT_INPUTS, "(N, D)", fits=lambda shape: len(shape) == 2, binds_strides=False
        ),
        TensorSpec(
            "codebooks",
            FLOAT_INPUTS,
            "(L, K, D) with L, K >= 1",
            fits=lambda shape: len(shape) == 3 and min(shape[:2]) >= 1,
            binds_strides=False,
        ),
    ],
    settings=[METRIC, _weight("commitment_weight", 1.0), _weight("codebook_weight", 0.0)],
    check=lambda call: check_same_dim(call, "codebooks"),
    outputs=("quantized", "codes", "level_codes", "residuals", "loss"),
    returns=("quantized", "codes", "level_codes", "residuals", "loss"),
    # the residuals reach the caller as the EMA update's detached inputs
    differentiable_outputs=("quantized", "loss"),
    saved=("residuals", "level_codes"),
    # the codebooks' gradient takes their shape and dtype; an EMA update rewrites their values
    # in place before the backward runs
    saved_meta=("codebooks",),
    backward_needs=True,
    reference=residual_outputs_reference,
    plan=_plan,
    fake=_fake,
    backward_fake=_backward_fake,
    backward_plan=_backward_plan,
)
