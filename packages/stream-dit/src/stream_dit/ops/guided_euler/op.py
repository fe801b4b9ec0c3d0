"""``guided_euler``'s declaration: from it ``triton_dispatch`` derives the custom op
``stream_dit::guided_euler`` (functional, with its fake; a traced call writes the updated state
back), the eager plan cache, the reference route and the checks of the tensors. The op takes the
row tables that :func:`~stream_dit.ops.guided_euler.guided_euler_` builds from its host lists."""

from __future__ import annotations

import torch

from triton_dispatch.declaration import Call, OpDeclaration, TensorSpec

from .reference import guided_euler_rows_reference_

VELOCITY_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check(call: Call) -> None:
    """What the specs of single tensors cannot say: channels that agree, (T, C) rows, distinct
    state rows, one table column per row."""
    state, velocity, rows, params = (call[n] for n in ("state", "velocity", "rows", "params"))
    if state.shape[2] != velocity.shape[2]:
        raise ValueError(
            f"channel mismatch: state C={state.shape[2]}, velocity C={velocity.shape[2]}"
        )
    for name, t in (("state", state), ("velocity", velocity)):
        if t.stride(1) != t.shape[2] or t.stride(2) != 1:
            raise ValueError(
                f"{name} rows must be contiguous (T, C) blocks, got strides {t.stride()} for "
                f"shape {tuple(t.shape)}"
            )
    if state.shape[0] > 1 and state.stride(0) < state.shape[1] * state.shape[2]:
        # an expanded (stride-0) or otherwise overlapping state would alias the rows it updates
        raise ValueError(
            f"state rows overlap in memory (strides {state.stride()}); it is updated in place, "
            "pass a tensor whose (T, C) rows are distinct"
        )
    if rows.shape[1] != params.shape[1]:
        raise ValueError(f"rows {tuple(rows.shape)} and params {tuple(params.shape)} must agree")


def _plan(call: Call):
    from .forward import guided_euler_plan  # Triton is imported once a kernel is planned

    return guided_euler_plan(call)


def _table(name: str, dtype: torch.dtype, height: int) -> TensorSpec:
    return TensorSpec(
        name, (dtype,), f"({height}, R)", fits=lambda shape: len(shape) == 2 and shape[0] == height,
        contiguous=True, differentiable=False,
    )  # fmt: skip


def _rank3(shape: torch.Size) -> bool:
    return len(shape) == 3


GUIDED_EULER = OpDeclaration(
    "stream_dit::guided_euler",
    inputs=[
        TensorSpec("state", (torch.float32,), "(S, T, C)", fits=_rank3, differentiable=False),
        TensorSpec(
            "velocity", VELOCITY_DTYPES, "(R, T, C)", fits=_rank3, differentiable=False,
            dtypes_expected="a floating-point tensor (float32, float16, bfloat16 or float64)",
        ),
        _table("rows", torch.int64, 4),  # slot, pos, neg, numel = length·C
        _table("params", torch.float32, 2),  # guidance, dt
    ],
    check=_check,
    mutates=("state",),
    outputs=(),
    returns=(),
    reference=guided_euler_rows_reference_,
    plan=_plan,
    fake=lambda state, velocity, rows, params: (),
)  # fmt: skip
