"""``nearest_code``'s declaration: from it ``triton_dispatch`` derives the custom op
``vq_kernels::nearest_code`` (fake included), the eager plan cache, the reference route and the
argument checks. The search has no gradient; ``quantize`` gathers the codebook rows itself."""

from __future__ import annotations

import torch

from triton_dispatch.declaration import Call, OpDeclaration, SettingSpec, TensorSpec

from .._validation import FLOAT_INPUTS
from .reference import METRICS, quantize_reference

# Any unusable metric has always been a ValueError, whatever its type.
METRIC = SettingSpec("metric", str, "l2", choices=METRICS, type_error=ValueError)


def check_same_dim(call: Call, name: str) -> None:
    """x's D must equal the codebook's (named ``name`` in the error)."""
    x, codebook = call["x"], call[name]
    if x.shape[-1] != codebook.shape[-1]:
        raise ValueError(
            f"x's last dimension ({x.shape[-1]}) must equal D of {name} ({codebook.shape[-1]})"
        )


def _check(call: Call) -> None:
    check_same_dim(call, "codebook")
    k, num_codes = call["k"], call["codebook"].shape[0]
    if not 1 <= k <= num_codes:
        raise ValueError(f"k must be an int in [1, K={num_codes}], got {k!r}")


def _plan(call: Call):
    from .kernels import nearest_code_plan

    return nearest_code_plan(call)


def _reference(x, codebook, *, metric, k):
    return quantize_reference(x.detach(), codebook.detach().to(x.dtype), metric, k)


def _fake(x, codebook, *, metric, k):
    return x.new_empty((x.shape[0],) if k == 1 else (x.shape[0], k), dtype=torch.int64)


NEAREST_CODE = OpDeclaration(
    "vq_kernels::nearest_code",
    inputs=[
        # the plan reads each call's strides (the kernels take any row stride): one plan serves
        # every layout of a shape
        TensorSpec(
            "x",
            FLOAT_INPUTS,
            "(B, D)",
            fits=lambda shape: len(shape) == 2,
            differentiable=False,
            binds_strides=False,
        ),
        TensorSpec(
            "codebook",
            FLOAT_INPUTS,
            "(K, D) with K >= 1",
            fits=lambda shape: len(shape) == 2 and shape[0] >= 1,
            differentiable=False,
            binds_strides=False,
        ),
    ],
    settings=[
        METRIC,
        SettingSpec("k", int, 1, type_error=ValueError),  # the bound on k is K: see _check
    ],
    check=_check,
    outputs=("codes",),
    returns=("codes",),
    reference=_reference,
    plan=_plan,
    fake=_fake,
)
