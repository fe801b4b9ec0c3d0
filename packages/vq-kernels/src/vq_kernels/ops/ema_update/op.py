"""The declarations of ``ema_statistics`` and ``ema_update_``: from them ``triton_dispatch``
derives the custom ops ``vq_kernels::ema_statistics`` and ``vq_kernels::ema_update`` (fakes
included; the update's op is functional and a traced call writes its results into the state), the
eager plan caches, the reference routes and the argument checks."""

from __future__ import annotations

import torch

from triton_dispatch.declaration import Call, OpDeclaration, PassedSpec, SettingSpec, TensorSpec

from .._validation import FLOAT_INPUTS
from .plan import apply_update, statistics_plan, statistics_reference, update_plan
from .reference import SEMANTICS

INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
STATES = (torch.float32, torch.float64)


def _float(name: str, dtypes=FLOAT_INPUTS, **kw) -> TensorSpec:
    allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
    return TensorSpec(
        name, dtypes, "", differentiable=False,
        dtype_message=f"{{name}} must have dtype in ({allowed}), got {{dtype}}", **kw,
    )  # fmt: skip


def _integer(name: str, **kw) -> TensorSpec:
    return TensorSpec(
        name, INTEGERS, "", differentiable=False,
        dtypes_expected="an integer tensor (int32 or int64)", **kw,
    )  # fmt: skip


def _check_statistics(call: Call) -> None:
    x, codes = call["x"], call["codes"]
    if x.dim() not in (2, 3) or codes.shape != x.shape[:-1]:
        raise ValueError(
            f"x must be (B, D) or (L, B, D) and codes x.shape[:-1]; got x {tuple(x.shape)}, "
            f"codes {tuple(codes.shape)}"
        )


def _statistics_fake(x, codes, *, num_codes, deterministic):
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    lead = x.shape[:-2]
    return x.new_empty(*lead, num_codes, dtype=dtype), x.new_empty(
        *lead, num_codes, x.shape[-1], dtype=dtype
    )


EMA_STATISTICS = OpDeclaration(
    "vq_kernels::ema_statistics",
    inputs=[_float("x", binds_strides=False), _integer("codes", binds_strides=False)],
    settings=[SettingSpec("num_codes", int, 0), SettingSpec("deterministic", bool, False)],
    check=_check_statistics,
    outputs=("counts", "sums"),
    returns=("counts", "sums"),
    reference=statistics_reference,
    plan=statistics_plan,
    fake=_statistics_fake,
)


def _require_shape(name: str, t, shape, stacked: bool, meaning: tuple[str, str]) -> None:
    if t is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(
            f"{name} must have shape {meaning[stacked]} = {tuple(shape)}, got {tuple(t.shape)}"
        )


def _check_update(call: Call) -> None:
    """The shapes that must agree between the arguments, and what the settings ask of them."""
    x, codebook, cluster_size = call["x"], call["codebook"], call["cluster_size"]
    if x.dim() not in (2, 3):
        raise ValueError(f"x must be (B, D) or (L, B, D), got shape {tuple(x.shape)}")
    if call["embed_sum"].dtype != cluster_size.dtype:
        names = str(cluster_size.dtype).removeprefix("torch.")
        raise TypeError(f"embed_sum must have dtype in ({names}), got {call['embed_sum'].dtype}")
    stacked = x.dim() == 3
    lead, (batch, dim) = x.shape[:-2], x.shape[-2:]
    if codebook.dim() != x.dim() or codebook.shape[:-2] != lead or codebook.shape[-1] != dim:
        raise ValueError(
            f"codebook must have shape {'(L, K, D)' if stacked else '(K, D)'} matching x "
            f"{tuple(x.shape)} (D = {dim}), got {tuple(codebook.shape)}"
        )
    codes_per_level = (*lead, codebook.shape[-2])
    _require_shape("codes", call["codes"], (*lead, batch), stacked, ("(B,)", "(L, B)"))
    for name in ("cluster_size", "steps_since_active", "candidates"):
        _require_shape(name, call[name], codes_per_level, stacked, ("(K,)", "(L, K)"))
    _require_shape(
        "embed_sum", call["embed_sum"], (*codes_per_level, dim), stacked, ("(K, D)", "(L, K, D)")
    )
    restarts = call["dead_threshold"] is not None
    if call["steps_since_active"] is None and call["semantics"] == "active_only" and restarts:
        raise ValueError(
            "steps_since_active is required for semantics='active_only' with restarts "
            "(pass an int tensor of zeros of shape (K,) / (L, K), or dead_threshold=None)"
        )
    generator = call.passed["generator"]
    if generator is not None and torch.device(generator.device).type != call.device.type:
        raise ValueError(f"generator is on {generator.device} but the tensors are on {call.device}")


def _default_candidates(call: Call):
    """One ``torch.randint`` over every code (dead or not) from the passed generator: no host
    sync, and every backend takes the same draws from the same generator state."""
    batch, grouped = call["x"].shape[-2], call.passed["process_group"] is not None
    if call["dead_threshold"] is None or (batch == 0 and not grouped):
        return None  # no restarts, or the no-op of an empty batch
    shape, device, high = call["cluster_size"].shape, call.device, max(batch, 1)
    return lambda generator=None, process_group=None: torch.randint(
        0, high, shape, generator=generator, device=device
    )


def _update_fake(x, codes, codebook, cluster_size, *args, **settings):
    return cluster_size.new_empty(cluster_size.shape, dtype=torch.bool)


def _group_of(name: str):
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


def _positive(name: str, default, expected: str, **kw) -> SettingSpec:
    return SettingSpec(name, float, default, valid=lambda v: v > 0, expected=expected, **kw)


DECAY = SettingSpec(
    "decay", float, 0.99, valid=lambda d: 0.0 <= d <= 1.0, expected="a number in [0, 1]",
    type_error=ValueError,
)  # fmt: skip
DEAD_THRESHOLD = _positive(
    "dead_threshold", None, "> 0 (or None to disable restarts): a threshold <= 0 would declare "
    "every code dead at every step", nullable=True,
)  # fmt: skip
EMA_UPDATE = OpDeclaration(
    "vq_kernels::ema_update",
    inputs=[
        _float("x", binds_strides=False),
        _integer("codes", binds_strides=False),
        _float("codebook", contiguous=True),
        _float("cluster_size", STATES, contiguous=True),
        _float("embed_sum", STATES, contiguous=True),
        _integer("steps_since_active", optional=True, contiguous=True),
        _integer("candidates", optional=True, binds_strides=False, default=_default_candidates),
    ],
    settings=[
        DECAY,
        _positive("eps", 1e-5, "> 0", type_error=ValueError),
        SettingSpec("semantics", str, "active_only", choices=SEMANTICS, type_error=ValueError),
        DEAD_THRESHOLD,
        SettingSpec("deterministic", bool, False),
        SettingSpec("check_codes", bool, None, nullable=True),
    ],
    check=_check_update,
    passed=[
        PassedSpec("generator", key=lambda g: None if g is None else g.device),
        PassedSpec("process_group", schema="str?", to_op=lambda g: g.group_name, from_op=_group_of),
    ],
    mutates=("codebook", "cluster_size", "embed_sum", "steps_since_active"),
    outputs=("replaced",),
    returns=("replaced",),
    reference=apply_update,
    plan=update_plan,
    fake=_update_fake,
)
