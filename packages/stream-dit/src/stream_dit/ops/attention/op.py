"""``attention``'s declaration: from it ``triton_dispatch`` derives the custom op
``stream_dit::attention`` with its fake, the eager plan cache, the reference route and the checks
of the call. Inference only."""

from __future__ import annotations

import math

import torch

from triton_dispatch.declaration import Call, OpDeclaration, SettingSpec, TensorSpec

from .reference import attention_reference

FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def check_heads(call: Call, names: tuple[str, ...] = ("q", "k", "v")) -> None:
    """The checks of queries, keys (and values, when ``names`` holds ``"v"``), key mask and norm
    weights that the specs of single tensors cannot make; shared with ``attention_weights``."""
    q, k, mask = call["q"], call["k"], call["key_mask"]
    b, _, heads, d = q.shape
    if "v" in names and k.shape != call["v"].shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and "
                         f"{tuple(call['v'].shape)}")  # fmt: skip
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k must be (B={b}, M, Hkv, d={d}), got {tuple(k.shape)}")
    if k.shape[2] < 1 or heads % k.shape[2]:
        raise ValueError(f"the query heads ({heads}) must be a multiple of the key/value heads "
                         f"({k.shape[2]})")  # fmt: skip
    if d < 16 or d > 256 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two in [16, 256], got {d}")
    dtypes = [call[name].dtype for name in names]
    if any(dt != q.dtype for dt in dtypes):
        raise TypeError(f"{', '.join(names[:-1])} and {names[-1]} must share a dtype, got "
                        f"{', '.join(map(str, dtypes))}")  # fmt: skip
    for name in names:
        if call[name].stride(3) != 1:
            raise ValueError(f"{name} must have unit stride along head_dim, got strides "
                             f"{call[name].stride()}")  # fmt: skip
    if mask is not None and tuple(mask.shape) != (b, k.shape[1]):
        raise ValueError(f"key_mask must be ({b}, {k.shape[1]}) (B, M), got {tuple(mask.shape)}")
    for name in ("q_weight", "k_weight"):
        w = call[name]
        if w is not None and tuple(w.shape) != (d,):
            raise ValueError(f"{name} must have shape ({d},) (head_dim), got {tuple(w.shape)}")


def _plan(call: Call):
    if call["q"].numel() == 0 or call["k"].shape[1] == 0:
        return None  # nothing to attend: the reference's zeros
    from .kernels import attention_plan  # Triton is imported once a kernel is planned

    return attention_plan(call)


def norm_weight_spec(name: str) -> TensorSpec:
    return TensorSpec(name, FLOATS, "(head_dim,)", fits=lambda s: len(s) == 1, contiguous=True,
                      optional=True, differentiable=False)  # fmt: skip


def heads_spec(name: str) -> TensorSpec:
    return TensorSpec(name, FLOATS, "(B, N, H, d)", fits=lambda s: len(s) == 4,
                      differentiable=False)  # fmt: skip


#: The key mask and the two norm weights, after the heads (shared with ``attention_weights``).
MASK_AND_NORMS = [
    TensorSpec("key_mask", (torch.bool,), "(B, M)", fits=lambda s: len(s) == 2, optional=True,
               differentiable=False),
    norm_weight_spec("q_weight"),
    norm_weight_spec("k_weight"),
]  # fmt: skip
SCALE = SettingSpec("scale", float, 1.0, valid=lambda s: math.isfinite(s) and s > 0,
                    expected="a finite float > 0")  # fmt: skip
EPS = SettingSpec("eps", float, 1e-6, valid=lambda e: e > 0, expected="a float > 0")

ATTENTION = OpDeclaration(
    "stream_dit::attention",
    inputs=[heads_spec("q"), heads_spec("k"), heads_spec("v"), *MASK_AND_NORMS],
    settings=[
        SCALE,
        SettingSpec("window", int, -1, valid=lambda w: w >= -1,
                    expected="an int >= 0, or -1 for no window"),
        EPS,
    ],
    check=check_heads,
    outputs=("out",),
    returns=("out",),
    reference=attention_reference,
    plan=_plan,
    fake=lambda q, k, v, key_mask, q_weight, k_weight, **settings: q.new_empty(q.shape),
)  # fmt: skip
