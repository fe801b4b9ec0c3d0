"""``snake_conv``: a layer prepared once (:func:`prepare_snake_conv`: checks, its tensors in the
dtypes the kernel reads), then run per call through the declared op (:mod:`.op`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from triton_dispatch.declaration import Call

from .op import SNAKE_CONV, check_layer
from .reference import Head, Pointwise, Snake, output_length


@dataclass(frozen=True, eq=False)
class SnakeConv:
    """One prepared layer; see :mod:`.reference` for what it computes.

    Attributes:
        weight, bias, dilation, padding, phases, shift, pointwise, out_snake, store_out, head:
            as given to :func:`prepare_snake_conv` (the Snake constants and biases as float32,
            float64 for a float64 layer; the 1×1 weight in ``weight``'s dtype).
        taps, in_channels, out_channels: ``weight`` is ``(taps, in_channels, phases ·
            out_channels)``.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    dilation: int
    padding: int
    phases: int
    shift: int
    pointwise: Pointwise | None
    out_snake: Snake | None
    store_out: bool
    head: Head | None
    taps: int
    in_channels: int
    out_channels: int
    # what the op takes, derived from the fields above (so dataclasses.replace derives it anew)
    _tensors: tuple = field(init=False, repr=False)  # the layer's tensors after the weight
    _settings: dict[str, Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        pw, act, head = self.pointwise, self.out_snake, self.head
        tensors = (
            self.bias, *((None,) * 4 if pw is None else (pw.weight, pw.bias, *pw.snake)),
            *((None,) * 2 if act is None else act),
            *((None,) * 2 if head is None else (head.weight, head.bias)),
        )  # fmt: skip
        settings = dict(
            dilation=self.dilation, padding=self.padding, phases=self.phases, shift=self.shift,
            store_out=self.store_out, head_dilation=1 if head is None else head.dilation,
            head_padding=0 if head is None else head.padding,
        )  # fmt: skip
        object.__setattr__(self, "_tensors", tensors)
        object.__setattr__(self, "_settings", settings)

    def output_length(self, length_in: int) -> int:
        """Time steps out for ``length_in`` in: ``length_in`` for a convolution, and a transposed
        one's ``(length_in − 1)·stride − 2·shift + 2·stride`` (kernel twice the stride)."""
        return output_length(length_in, self.phases, self.shift)


def _as(t: Any, dtype: torch.dtype, device: torch.device) -> Any:
    """``t`` in ``dtype`` on ``device``, contiguous; anything but a floating-point tensor as given
    (the op's checks name it)."""
    if isinstance(t, torch.Tensor) and t.is_floating_point():
        return t.to(device=device, dtype=dtype).contiguous()
    return t


def prepare_snake_conv(
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    dilation: int = 1,
    padding: int | None = None,
    phases: int = 1,
    shift: int = 0,
    pointwise: Pointwise | None = None,
    out_snake: Snake | None = None,
    store_out: bool = True,
    head: Head | None = None,
) -> SnakeConv:
    """Check one layer once for :func:`snake_conv`.

    Args:
        weight: ``(taps, C_in, phases · C_out)``, the activations' dtype and device.
        bias: ``(phases · C_out,)`` or ``None``.
        dilation: spacing of the taps. padding: input steps before the first tap (default
            ``(taps − 1)·dilation // 2``, a "same" convolution).
        phases, shift: output row ``q``, column ``r·C_out + c`` goes to time ``q·phases + r −
            shift`` (a transposed convolution of stride ``phases`` and padding ``shift``).
        pointwise: Snake and a ``(C_out, C_out)`` 1×1 convolution after the bias (``phases`` 1,
            ``C_out <= 128``).
        out_snake: also return ``snake(out)`` with these constants. store_out: return ``out``.
        head: return this convolution of ``snake(out)`` instead of ``snake(out)`` (``phases``
            1, ``C_out <= 128``, "same" padding; a decoder's last layer).

    Raises:
        ValueError / TypeError: naming the argument and the shape or value expected.
    """
    if not isinstance(weight, torch.Tensor) or weight.dim() != 3:
        raise ValueError("weight must be a tensor of shape (taps, C_in, phases * C_out)")
    if weight.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"weight must be float16, bfloat16, float32 or float64, got {weight.dtype}")
    if head is not None and not isinstance(head, Head):
        raise TypeError(f"head must be a Head, got {type(head).__name__}")
    if padding is None and isinstance(dilation, int):
        padding = (weight.shape[0] - 1) * dilation // 2
    given = (dilation, padding, phases, shift, bool(store_out),
             *((1, 0) if head is None else (head.dilation, head.padding)))  # fmt: skip
    settings = {
        spec.name: spec.check(v) for spec, v in zip(SNAKE_CONV.settings, given, strict=True)
    }
    # constants the kernel reads as float32 (float64 kept for the float64 reference)
    const = torch.float64 if weight.dtype == torch.float64 else torch.float32
    device = weight.device
    if pointwise is not None:
        pointwise = Pointwise(
            Snake(*(_as(t, const, device) for t in pointwise.snake)),
            _as(pointwise.weight, weight.dtype, device), _as(pointwise.bias, const, device),
        )  # fmt: skip
    if out_snake is not None:
        out_snake = Snake(*(_as(t, const, device) for t in out_snake))
    if head is not None:
        head = head._replace(bias=_as(head.bias, const, device))
    taps, cin, n = weight.shape
    layer = SnakeConv(
        weight.contiguous(), _as(bias, const, device), settings["dilation"], settings["padding"],
        phases, shift, pointwise, out_snake, settings["store_out"], head, taps, cin, n // phases,
    )  # fmt: skip
    tensors = (layer.weight, *layer._tensors)
    for spec, t in zip(SNAKE_CONV.inputs[1:-1], tensors, strict=True):
        spec.check(t)
    names = [spec.name for spec in SNAKE_CONV.inputs[1:-1]]
    check_layer(Call(dict(zip(names, tensors, strict=True)), settings, device, "torch"))
    return layer


def snake_conv(
    x: torch.Tensor,
    layer: SnakeConv,
    *,
    residual: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Run ``layer`` on ``x`` ``(B, L_in, C_in)``: ``(out, snake_out)``, each ``(B, L_out,
    C_out)`` or ``None`` where the layer does not give it; with a head, ``(out, head_out)``,
    ``head_out`` ``(B, L_out, C_head)``.

    Args:
        x: channels-last activations, contiguous, the layer's dtype and device.
        layer: from :func:`prepare_snake_conv`.
        residual: ``(B, L_out, C_out)`` added before the output is rounded.
        backend: see :func:`triton_dispatch.select_backend` (float64 runs the reference).

    Raises:
        ValueError / TypeError: for shapes, dtypes or devices that do not match the layer.
    """
    if not isinstance(layer, SnakeConv):
        raise TypeError(f"layer must come from prepare_snake_conv, got {type(layer).__name__}")
    out, second = SNAKE_CONV(
        x, layer.weight, *layer._tensors, residual, backend=backend, **layer._settings
    )
    gives_second = layer.out_snake is not None or layer.head is not None
    return (out if layer.store_out else None), (second if gives_second else None)


def snake_conv_ahead(
    x: torch.Tensor,
    layer: SnakeConv,
    *,
    residual: torch.Tensor | None = None,
    backend: str | None = None,
) -> None:
    """Build the plan of ``snake_conv(x, layer, residual=residual)`` and start compiling its
    kernels on background threads, so that the call, when it comes, finds them compiled (or
    waits for the compile already running). Only the arguments' shapes, dtypes and devices are
    read: ``x`` and ``residual`` may hold anything. Does nothing more than check and plan where
    calls do not compile (the interpreter, the CPU, the reference, float64).

    Raises:
        ValueError / TypeError: what the call itself would raise for these arguments.
    """
    if not isinstance(layer, SnakeConv):
        raise TypeError(f"layer must come from prepare_snake_conv, got {type(layer).__name__}")
    plan = SNAKE_CONV.plan_for(
        x, layer.weight, *layer._tensors, residual, backend=backend, **layer._settings
    )
    if plan is not None:
        plan.compile_ahead()
