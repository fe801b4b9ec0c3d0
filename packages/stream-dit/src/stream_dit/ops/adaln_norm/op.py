"""The declarations of the AdaLN norm ops: from each ``triton_dispatch`` derives a custom op
(``stream_dit::adaln_rms_norm``, ``stream_dit::rms_norm_modulate``) with its fake, the eager plan
cache, the reference route and the checks of the call. Inference only: no backward."""

from __future__ import annotations

import torch

from triton_dispatch.declaration import Call, OpDeclaration, SettingSpec, TensorSpec

from .reference import (
    adaln_rms_norm_fp8_reference,
    adaln_rms_norm_reference,
    rms_norm_modulate_fp8_reference,
    rms_norm_modulate_reference,
)

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check(call: Call) -> None:
    """Sizes and pairings the specs of single tensors cannot compare."""
    x, weight = call["x"], call["weight"]
    b, _, width = x.shape
    if tuple(weight.shape) != (width,):
        raise ValueError(f"weight must have shape ({width},) (D of x), got {tuple(weight.shape)}")
    delta = call.tensors.get("delta")
    if delta is not None and (delta.shape != x.shape or delta.dtype != x.dtype):
        raise ValueError(
            f"delta must match x: shape {tuple(x.shape)} and dtype {x.dtype}, got "
            f"{tuple(delta.shape)} and {delta.dtype}"
        )
    if (call["scale"] is None) != (call["shift"] is None):
        raise ValueError("scale and shift go together (AdaLN modulation), got one of them")
    for name in ("gate", "scale", "shift"):
        t = call.tensors.get(name)
        if t is None:
            continue
        if tuple(t.shape) != (b, width):
            raise ValueError(f"{name} must have shape ({b}, {width}) (B, D), got {tuple(t.shape)}")
        if t.stride(1) != 1:
            raise ValueError(f"{name} must have unit stride along D, got strides {t.stride()}")


def _plan(call: Call, fp8: bool = False):
    if call["x"].numel() == 0:
        return None  # nothing to launch: the reference returns empty tensors
    from .kernels import adaln_rms_norm_plan  # Triton is imported once a kernel is planned

    return adaln_rms_norm_plan(call, fp8=fp8)


def _plan_fp8(call: Call):
    return _plan(call, fp8=True)


def _fp8_like(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn),
            torch.empty(x.shape[:2], device=x.device, dtype=torch.float32))  # fmt: skip


def _rank(n: int):
    return lambda shape: len(shape) == n


def _modulation(name: str) -> TensorSpec:
    return TensorSpec(name, FLOATS, "(B, D)", fits=_rank(2), optional=True, differentiable=False)


_X = TensorSpec("x", FLOATS, "(B, N, D)", fits=_rank(3), contiguous=True, differentiable=False)
_WEIGHT = TensorSpec("weight", FLOATS, "(D,)", fits=_rank(1), contiguous=True,
                     differentiable=False)  # fmt: skip
_EPS = SettingSpec("eps", float, 1e-6, valid=lambda v: v > 0, expected="a float > 0")

_ADALN_INPUTS = [
    _X,
    _WEIGHT,
    TensorSpec("delta", FLOATS, "(B, N, D)", fits=_rank(3), contiguous=True,
               differentiable=False),
    _modulation("gate"),
    _modulation("scale"),
    _modulation("shift"),
]  # fmt: skip

ADALN_RMS_NORM = OpDeclaration(
    "stream_dit::adaln_rms_norm",
    inputs=_ADALN_INPUTS,
    settings=[_EPS],
    check=_check,
    outputs=("residual", "normed"),
    returns=("residual", "normed"),
    reference=adaln_rms_norm_reference,
    plan=_plan,
    fake=lambda x, weight, delta, gate, scale, shift, **s: (x.new_empty(x.shape),
                                                             x.new_empty(x.shape)),
)  # fmt: skip

RMS_NORM_MODULATE = OpDeclaration(
    "stream_dit::rms_norm_modulate",
    inputs=[_X, _WEIGHT, _modulation("scale"), _modulation("shift")],
    settings=[_EPS],
    check=_check,
    outputs=("normed",),
    returns=("normed",),
    reference=rms_norm_modulate_reference,
    plan=_plan,
    fake=lambda x, weight, scale, shift, **s: x.new_empty(x.shape),
)

ADALN_RMS_NORM_FP8 = OpDeclaration(
    "stream_dit::adaln_rms_norm_fp8",
    inputs=_ADALN_INPUTS,
    settings=[_EPS],
    check=_check,
    outputs=("residual", "normed_q", "normed_scale"),
    returns=("residual", "normed_q", "normed_scale"),
    reference=adaln_rms_norm_fp8_reference,
    plan=_plan_fp8,
    fake=lambda x, weight, delta, gate, scale, shift, **s: (x.new_empty(x.shape), *_fp8_like(x)),
)

RMS_NORM_MODULATE_FP8 = OpDeclaration(
    "stream_dit::rms_norm_modulate_fp8",
    inputs=[_X, _WEIGHT, _modulation("scale"), _modulation("shift")],
    settings=[_EPS],
    check=_check,
    outputs=("normed_q", "normed_scale"),
    returns=("normed_q", "normed_scale"),
    reference=rms_norm_modulate_fp8_reference,
    plan=_plan_fp8,
    fake=lambda x, weight, scale, shift, **s: _fp8_like(x),
)
