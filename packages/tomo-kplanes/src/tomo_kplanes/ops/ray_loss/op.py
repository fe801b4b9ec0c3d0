"""``ray_loss``'s declaration: from it ``triton_dispatch`` derives the custom ops
``tomo_kplanes::ray_loss`` and ``..._backward`` (fakes and autograd included), the eager autograd
path, the plan cache, the reference route and the argument checks."""

from __future__ import annotations

import math

import torch

from triton_dispatch.declaration import Call, OpDeclaration, SettingSpec, TensorSpec

from .kernels import ray_loss_backward_plan, ray_loss_plan
from .reference import ray_loss_reference

_FLOATS = (torch.float32, torch.float64)


def _rank(n: int):
    return lambda shape: len(shape) == n


def _samples(shape) -> bool:
    return len(shape) == 3 and shape[2] == 3


def _finite(name: str, default: float, *, nonnegative: bool = False) -> SettingSpec:
    if nonnegative:
        return SettingSpec(
            name, float, default, valid=lambda v: math.isfinite(v) and v >= 0,
            expected="a finite number >= 0",
        )  # fmt: skip
    return SettingSpec(name, float, default, valid=math.isfinite, expected="a finite number")


def _check(call: Call) -> None:
    """The sizes that follow from each other, one dtype, and a step for the taps."""
    densities, points = call["densities"], call["points"]
    b, s = points.shape[0], points.shape[1]
    for name in ("steps", "target"):
        if call[name].shape[0] != b:
            raise ValueError(
                f"{name} must have shape (B,) = ({b},) like points, got {tuple(call[name].shape)}"
            )
    if densities.shape[0] < b * s or (densities.shape[0] - b * s) % 4:
        raise ValueError(
            f"densities must have shape (B·S + 4·M,) with B·S = {b * s} from points, "
            f"got {tuple(densities.shape)}"
        )
    shared = [call[n] for n in ("densities", "points", "steps", "target")]
    if len({t.dtype for t in shared}) != 1:
        raise TypeError(
            "densities, points, steps and target must share one dtype, got "
            + ", ".join(str(t.dtype) for t in shared)
        )
    if densities.shape[0] > b * s and call["tv_step"] <= 0:
        raise ValueError(f"tv_step must be > 0 when densities hold taps, got {call['tv_step']}")


def _fake(densities, points, steps, target, plane_tv, **settings):
    new = densities.new_empty
    return new(()), new(3), new(points.shape[0])


def _backward_fake(grad_total, grad_terms, densities, points, steps, plane_tv, resid, **settings):
    return torch.empty_like(densities), densities.new_empty(())


RAY_LOSS = OpDeclaration(
    "tomo_kplanes::ray_loss",
    inputs=[
        TensorSpec("densities", _FLOATS, "(B·S + 4·M,)", fits=_rank(1)),
        TensorSpec("points", _FLOATS, "(B, S, 3)", fits=_samples, differentiable=False),
        TensorSpec("steps", _FLOATS, "(B,)", fits=_rank(1), differentiable=False),
        TensorSpec("target", _FLOATS, "(B,)", fits=_rank(1), differentiable=False),
        TensorSpec("plane_tv", _FLOATS, "() (a 0-d tensor)", fits=_rank(0), optional=True),
    ],
    settings=[
        _finite("tv_step", 1.0),
        _finite("volume_tv_weight", 0.0),
        _finite("plane_tv_weight", 0.0),
        SettingSpec("positivity", bool, True),
        _finite("shrinkage", 0.0, nonnegative=True),
        SettingSpec("mask_out_of_bounds", bool, True),
    ],
    check=_check,
    # the residuals of the line integrals are the backward's, not the caller's
    outputs=("total", "terms", "resid"),
    returns=("total", "terms"),
    # plane_tv only says whether there is one (the backward plan's weight store depends on it)
    saved=("densities", "points", "steps", "plane_tv", "resid"),
    # the plan binds the points' strides
    keep_strides=("points",),
    reference=ray_loss_reference,
    plan=ray_loss_plan,
    fake=_fake,
    backward_fake=_backward_fake,
    backward_plan=ray_loss_backward_plan,
)
