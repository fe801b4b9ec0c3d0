"""``qk_norm_rotary_``'s declaration: from it ``triton_dispatch`` derives the custom op
``stream_dit::qk_norm_rotary`` (functional, with its fake; a traced call writes the result back),
the eager plan cache, the reference route and the checks of the call. Inference only."""

from __future__ import annotations

import torch

from triton_dispatch.declaration import Call, OpDeclaration, SettingSpec, TensorSpec

from .reference import qk_norm_rotary_reference_

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check(call: Call) -> None:
    """What the specs of single tensors cannot say: a head size both weights share, even and a
    power of two; heads that fit in a row; tables that cover every position."""
    x, wq, wk = call["x"], call["weight_q"], call["weight_k"]
    d = wq.numel()
    if wk.numel() != d:
        raise ValueError(f"weight_q and weight_k must have one size (head_dim), got {d} and "
                         f"{wk.numel()}")  # fmt: skip
    if d < 2 or d & (d - 1):
        raise ValueError(f"head_dim (the size of weight_q) must be a power of two >= 2, got {d}")
    heads = call["q_heads"] + call["k_heads"]
    if heads * d > x.shape[2]:
        raise ValueError(f"q_heads + k_heads = {heads} heads of {d} do not fit in x's last "
                         f"dimension {x.shape[2]}")  # fmt: skip
    cos, sin = call["cos"], call["sin"]
    if (cos is None) != (sin is None):
        raise ValueError("cos and sin go together (the rotary tables), got one of them")
    if cos is not None:
        for name, t in (("cos", cos), ("sin", sin)):
            if t.shape[0] < x.shape[1] or t.shape[1] != d:
                raise ValueError(f"{name} must have shape (>= {x.shape[1]}, {d}) (N, head_dim), "
                                 f"got {tuple(t.shape)}")  # fmt: skip


def _plan(call: Call):
    if call["x"].numel() == 0 or call["q_heads"] + call["k_heads"] == 0:
        return None  # nothing to normalise: the reference's no-op
    from .kernels import qk_norm_rotary_plan  # Triton is imported once a kernel is planned

    return qk_norm_rotary_plan(call)


def _count(name: str) -> SettingSpec:
    return SettingSpec(name, int, 0, valid=lambda v: v >= 0, expected="an int >= 0")


def _table(name: str) -> TensorSpec:
    return TensorSpec(name, (torch.float32,), "(N, head_dim)", fits=lambda s: len(s) == 2,
                      contiguous=True, optional=True, differentiable=False)  # fmt: skip


def _weight(name: str) -> TensorSpec:
    return TensorSpec(name, FLOATS, "(head_dim,)", fits=lambda s: len(s) == 1, contiguous=True,
                      differentiable=False)  # fmt: skip


QK_NORM_ROTARY = OpDeclaration(
    "stream_dit::qk_norm_rotary",
    inputs=[
        TensorSpec("x", (torch.float16, torch.bfloat16, torch.float32), "(B, N, W)",
                   fits=lambda s: len(s) == 3, contiguous=True, differentiable=False),
        _weight("weight_q"),
        _weight("weight_k"),
        _table("cos"),
        _table("sin"),
    ],
    settings=[
        _count("q_heads"),
        _count("k_heads"),
        SettingSpec("eps", float, 1e-6, valid=lambda v: v > 0, expected="a float > 0"),
    ],
    check=_check,
    mutates=("x",),
    outputs=(),
    returns=(),
    reference=qk_norm_rotary_reference_,
    plan=_plan,
    fake=lambda x, weight_q, weight_k, cos, sin, **settings: (),
)  # fmt: skip
