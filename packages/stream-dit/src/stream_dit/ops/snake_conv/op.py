"""``snake_conv``'s declaration: from it ``triton_dispatch`` derives the custom op
``stream_dit::snake_conv`` with its fake, the eager plan cache, the reference route and the checks
of the call. The op takes a layer's tensors one by one (``None`` for the parts it lacks) and its
shape settings; :func:`~.dispatch.prepare_snake_conv` checks a layer once through
:func:`check_layer`, the same checks the op's first call of each kind runs."""

from __future__ import annotations

import torch

from triton_dispatch.declaration import Call, OpDeclaration, SettingSpec, TensorSpec

from .plan import WHOLE_ROW_MAX, snake_conv_plan
from .reference import Head, Pointwise, Snake, output_length, snake_conv_reference

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: the names the errors give the op's tensors: those of :func:`~.dispatch.prepare_snake_conv`
SHOWN = {
    "pw_weight": "pointwise.weight", "pw_bias": "pointwise.bias",
    "pw_alpha": "pointwise.snake.alpha", "pw_inv_beta": "pointwise.snake.inv_beta",
    "out_alpha": "out_snake.alpha", "out_inv_beta": "out_snake.inv_beta",
    "head_weight": "head.weight", "head_bias": "head.bias",
}  # fmt: skip


def _vector_shape(call: Call, name: str, size: int) -> None:
    t = call[name]
    if t is not None and tuple(t.shape) != (size,):
        raise ValueError(f"{SHOWN.get(name, name)} must be a floating-point tensor of shape "
                         f"({size},), got {tuple(t.shape)}")  # fmt: skip


def check_layer(call: Call) -> None:
    """What a layer's tensors and settings must agree on (the specs check each one alone)."""
    weight, phases = call["weight"], call["phases"]
    taps, cin, n = weight.shape
    if min(taps, cin, n) < 1 or n % phases:
        raise ValueError(f"weight must be (taps, C_in, phases * C_out) with phases={phases}, "
                         f"got {tuple(weight.shape)}")  # fmt: skip
    cout = n // phases
    _vector_shape(call, "bias", n)
    if not (call["store_out"] or call["out_alpha"] is not None):
        raise ValueError("a layer must store its output, its out_snake, or both")
    if (call["out_alpha"] is None) != (call["out_inv_beta"] is None):
        raise ValueError("out_snake needs both alpha and inv_beta")
    for name in ("out_alpha", "out_inv_beta"):
        _vector_shape(call, name, cout)
    pw = call["pw_weight"]
    if pw is not None:
        if phases != 1 or cout > WHOLE_ROW_MAX:
            raise ValueError(f"pointwise needs phases == 1 and C_out <= {WHOLE_ROW_MAX}, "
                             f"got {phases} and {cout}")  # fmt: skip
        if tuple(pw.shape) != (cout, cout):
            raise ValueError(f"pointwise.weight must be ({cout}, {cout}), got {tuple(pw.shape)}")
        if call["pw_alpha"] is None or call["pw_inv_beta"] is None:
            raise ValueError("pointwise needs its Snake's alpha and inv_beta")
        for name in ("pw_bias", "pw_alpha", "pw_inv_beta"):
            _vector_shape(call, name, cout)
    elif any(call[n] is not None for n in ("pw_bias", "pw_alpha", "pw_inv_beta")):
        raise ValueError("pointwise.bias and pointwise.snake need pointwise.weight")
    for name in ("pw_weight", "head_weight"):
        t = call[name]
        if t is not None and (t.dtype != weight.dtype or t.device != weight.device):
            raise TypeError(f"{SHOWN[name]} must be {weight.dtype} on {weight.device}, like "
                            f"weight, got {t.dtype} on {t.device}")  # fmt: skip
    _check_head(call, cout)


def _check_head(call: Call, cout: int) -> None:
    head = call["head_weight"]
    if head is None:
        if call["head_bias"] is not None:
            raise ValueError("head.bias needs head.weight")
        return
    phases, shift = call["phases"], call["shift"]
    if phases != 1 or shift or cout > WHOLE_ROW_MAX or call["out_alpha"] is None:
        raise ValueError(
            f"head needs phases == 1, shift == 0, C_out <= {WHOLE_ROW_MAX} and an out_snake, "
            f"got {phases}, {shift}, {cout} and {call['out_alpha'] is not None}"
        )
    if head.shape[1] != cout or min(head.shape) < 1:
        raise ValueError(f"head.weight must be (taps, {cout}, C_head), got {tuple(head.shape)}")
    _vector_shape(call, "head_bias", head.shape[2])
    dilation, padding = call["head_dilation"], call["head_padding"]
    if 2 * padding != dilation * (head.shape[0] - 1):
        raise ValueError(
            "head must keep the length: 2·padding == dilation·(taps − 1), got "
            f"padding={padding}, dilation={dilation}, taps={head.shape[0]}"
        )


def _check(call: Call) -> None:
    check_layer(call)
    x, weight, residual = call["x"], call["weight"], call["residual"]
    if x.shape[2] != weight.shape[1]:
        raise ValueError(f"x must be (B, L, {weight.shape[1]}) channels-last, got {tuple(x.shape)}")
    if x.dtype != weight.dtype:
        raise TypeError(f"x must match the layer's weights ({weight.dtype} on {weight.device}), "
                        f"got {x.dtype} on {x.device}")  # fmt: skip
    if residual is not None:
        want = (x.shape[0], _length(call), weight.shape[2] // call["phases"])
        if tuple(residual.shape) != want:
            raise ValueError(f"residual must be a tensor of shape {want}, got "
                             f"{tuple(residual.shape)}")  # fmt: skip
        if residual.dtype != x.dtype:
            raise TypeError(f"residual must be {x.dtype}, like x, got {residual.dtype}")


def _length(call: Call) -> int:
    return output_length(call["x"].shape[1], call["phases"], call["shift"])


def snake_conv_routed(x, weight, bias, pw_weight, pw_bias, pw_alpha, pw_inv_beta, out_alpha,
                      out_inv_beta, head_weight, head_bias, residual, *, dilation, padding, phases,
                      shift, store_out, head_dilation, head_padding):  # fmt: skip
    """The op on the reference: ``(out, snake_out or head_out)``, an empty tensor for what the
    layer does not give."""
    pointwise = head = out_snake = None
    if pw_weight is not None:
        pointwise = Pointwise(Snake(pw_alpha, pw_inv_beta), pw_weight, pw_bias)
    if out_alpha is not None:
        out_snake = Snake(out_alpha, out_inv_beta)
    if head_weight is not None:
        head = Head(head_weight, head_bias, head_dilation, head_padding)
    out, second = snake_conv_reference(
        x, weight, bias, dilation=dilation, padding=padding, phases=phases, shift=shift,
        out_length=output_length(x.shape[1], phases, shift), pointwise=pointwise,
        residual=residual, out_snake=out_snake, store_out=store_out, head=head,
    )  # fmt: skip
    empty = x.new_empty(0)
    return (empty if out is None else out), (empty if second is None else second)


def _fake(x, weight, bias, pw_weight, pw_bias, pw_alpha, pw_inv_beta, out_alpha, out_inv_beta,
          head_weight, head_bias, residual, *, phases, shift, store_out, **_):  # fmt: skip
    batch, length = x.shape[0], output_length(x.shape[1], phases, shift)
    cout = weight.shape[2] // phases
    out = x.new_empty((batch, length, cout) if store_out else (0,))
    if head_weight is not None:
        return out, x.new_empty(batch, length, head_weight.shape[2])
    return out, x.new_empty((batch, length, cout) if out_alpha is not None else (0,))


def _tensor(name: str, shape: str, rank: int, optional: bool = True) -> TensorSpec:
    # every tensor is read as laid out, so contiguous; the plan binds no strides
    return TensorSpec(
        name, FLOATS, shape, fits=lambda s: len(s) == rank, contiguous=True, optional=optional,
        differentiable=False, binds_strides=False,
        dtypes_expected="a float16, bfloat16, float32 or float64 tensor",
    )  # fmt: skip


def _at_least(name: str, low: int, default: int) -> SettingSpec:
    return SettingSpec(name, int, default, valid=lambda v: v >= low, expected=f"an int >= {low}",
                       type_error=ValueError)  # fmt: skip


SNAKE_CONV = OpDeclaration(
    "stream_dit::snake_conv",
    inputs=[
        _tensor("x", "(B, L, C_in) channels-last", 3, optional=False),
        _tensor("weight", "(taps, C_in, phases * C_out)", 3, optional=False),
        _tensor("bias", "(phases * C_out,)", 1),
        _tensor("pw_weight", "(C_out, C_out)", 2),
        *(_tensor(n, "(C_out,)", 1) for n in ("pw_bias", "pw_alpha", "pw_inv_beta")),
        *(_tensor(n, "(C_out,)", 1) for n in ("out_alpha", "out_inv_beta")),
        _tensor("head_weight", "(taps, C_out, C_head)", 3),
        _tensor("head_bias", "(C_head,)", 1),
        _tensor("residual", "(B, L_out, C_out)", 3),
    ],
    settings=[
        _at_least("dilation", 1, 1),
        _at_least("padding", 0, 0),
        _at_least("phases", 1, 1),
        _at_least("shift", 0, 0),
        SettingSpec("store_out", bool, True),
        _at_least("head_dilation", 1, 1),
        _at_least("head_padding", 0, 0),
    ],
    check=_check,
    outputs=("out", "second"),
    returns=("out", "second"),
    reference=snake_conv_routed,
    plan=snake_conv_plan,
    fake=_fake,
)
