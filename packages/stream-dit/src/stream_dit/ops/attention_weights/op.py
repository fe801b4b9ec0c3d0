"""``attention_weights``'s declaration: from it ``triton_dispatch`` derives the custom op
``stream_dit::attention_weights`` with its fake, the eager plan cache, the reference route and
the checks of the call. Inference only."""

from __future__ import annotations

from triton_dispatch.declaration import Call, OpDeclaration

from ..attention.op import EPS, MASK_AND_NORMS, SCALE, check_heads, heads_spec
from .reference import attention_weights_reference

#: A head's keys fit one tile of the few-keys kernel (``attention.kernels.FEW_KEYS``).
MAX_KEYS = 128


def _check(call: Call) -> None:
    check_heads(call, ("q", "k"))
    if call["k"].shape[1] > MAX_KEYS:
        raise ValueError(f"k must hold at most {MAX_KEYS} keys (M), got {call['k'].shape[1]}: "
                         "use stream_dit.ops.attention for more")  # fmt: skip


def _plan(call: Call):
    if call["q"].numel() == 0 or call["k"].shape[1] == 0:
        return None  # nothing to weigh: the reference's empty or zero weights
    from .kernels import attention_weights_plan  # Triton is imported once a kernel is planned

    return attention_weights_plan(call)


ATTENTION_WEIGHTS = OpDeclaration(
    "stream_dit::attention_weights",
    inputs=[heads_spec("q"), heads_spec("k"), *MASK_AND_NORMS],
    settings=[SCALE, EPS],
    check=_check,
    outputs=("out",),
    returns=("out",),
    reference=attention_weights_reference,
    plan=_plan,
    fake=lambda q, k, key_mask, q_weight, k_weight, **settings: q.new_empty(
        (*q.shape[:3], k.shape[1])
    ),
)
