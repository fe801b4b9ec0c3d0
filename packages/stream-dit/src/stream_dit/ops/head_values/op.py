"""``head_values``'s declaration: from it ``triton_dispatch`` derives the custom op
``stream_dit::head_values`` with its fake, the eager plan cache, the reference route and the
checks of the call. Inference only."""

from __future__ import annotations

from triton_dispatch.declaration import Call, OpDeclaration, SettingSpec, TensorSpec

from ..attention.op import FLOATS
from ..attention_weights.op import MAX_KEYS  # a head's values fit one tile, as its keys do
from .reference import head_values_reference


def _check(call: Call) -> None:
    v, weight, heads = call["v"], call["weight"], call["heads"]
    _, m, kv_heads, d = v.shape
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of v's heads ({kv_heads})")
    if m > MAX_KEYS:
        raise ValueError(f"v must hold at most {MAX_KEYS} values (M), got {m}")
    if d < 16 or d > 256 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two in [16, 256], got {d}")
    if weight.shape[1] != heads * d:
        raise ValueError(f"weight must be (D_out, heads·d = {heads * d}), got "
                         f"{tuple(weight.shape)}")  # fmt: skip
    if weight.dtype != v.dtype:
        raise TypeError(f"v and weight must share a dtype, got {v.dtype} and {weight.dtype}")
    if v.stride(3) != 1:
        raise ValueError(f"v must have unit stride along head_dim, got strides {v.stride()}")


def _plan(call: Call):
    if call["v"].numel() == 0 or call["weight"].numel() == 0:
        return None  # the reference's empty or zero output
    from .kernels import head_values_plan  # Triton is imported once a kernel is planned

    return head_values_plan(call)


HEAD_VALUES = OpDeclaration(
    "stream_dit::head_values",
    inputs=[
        TensorSpec("v", FLOATS, "(B, M, Hkv, d)", fits=lambda s: len(s) == 4,
                   differentiable=False),
        TensorSpec("weight", FLOATS, "(D_out, H·d)", fits=lambda s: len(s) == 2, contiguous=True,
                   differentiable=False),
    ],
    settings=[
        SettingSpec("heads", int, 1, valid=lambda h: h >= 1, expected="an int >= 1"),
    ],
    check=_check,
    outputs=("out",),
    returns=("out",),
    reference=head_values_reference,
    plan=_plan,
    fake=lambda v, weight, *, heads: v.new_empty((v.shape[0], heads * v.shape[1], weight.shape[0])),
)  # fmt: skip
