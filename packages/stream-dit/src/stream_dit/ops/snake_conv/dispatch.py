"""``snake_conv``: a layer prepared once (:func:`prepare_snake_conv`: checks, zero-padded weights,
tile sizes), then run per call on the kernel or the reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from triton_dispatch import next_power_of_2, select_backend, uses_triton

from .reference import Head, Pointwise, Snake, rows_for, snake_conv_reference

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DTYPES = (*_KERNEL_DTYPES, torch.float64)
_POINTWISE_MAX = 128  # a 1x1 convolution folds in only while a row of channels fits one tile


def _padded_size(n: int, block: int) -> int:
    """``n`` rounded up to a power of two (at least 16, what ``tl.dot`` takes) below ``block``,
    to a multiple of ``block`` above it."""
    if n <= block:
        return max(16, next_power_of_2(n))
    return -(-n // block) * block


class _Padded(NamedTuple):
    """A layer's tensors as the kernel reads them (zero-padded to its tiles, constants float32)."""

    weight: torch.Tensor
    bias: torch.Tensor
    pw_alpha: torch.Tensor
    pw_inv_beta: torch.Tensor
    pw_weight: torch.Tensor
    pw_bias: torch.Tensor
    out_alpha: torch.Tensor
    out_inv_beta: torch.Tensor
    head_weight: torch.Tensor  # (N_P, head_p): column tap·C_head + c
    head_bias: torch.Tensor


@dataclass(frozen=True, eq=False)
class SnakeConv:
    """One prepared layer; see :mod:`.reference` for what it computes.

    Attributes:
        weight, bias, dilation, padding, phases, shift, pointwise, out_snake, store_out, head:
            as given to :func:`prepare_snake_conv` (the reference reads them).
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
    _tensors: _Padded
    _cin_p: int
    _n_p: int
    _head_p: int

    def output_length(self, length_in: int) -> int:
        """Time steps out for ``length_in`` in: ``length_in`` for a convolution, and a transposed
        one's ``(length_in − 1)·stride − 2·shift + 2·stride`` (kernel twice the stride)."""
        if self.phases == 1:
            return length_in
        return (length_in + 1) * self.phases - 2 * self.shift


def _vector(
    t: torch.Tensor | None, n: int, size: int, name: str, like: torch.Tensor
) -> torch.Tensor:
    out = torch.zeros(size, dtype=torch.float32, device=like.device)
    if t is None:
        return out
    if not isinstance(t, torch.Tensor) or t.shape != (n,) or not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor of shape ({n},)")
    out[:n] = t.to(torch.float32)
    return out


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
    """Check and pad one layer's weights for :func:`snake_conv`.

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
    if weight.dtype not in _DTYPES:
        raise TypeError(f"weight must be float16, bfloat16, float32 or float64, got {weight.dtype}")
    for name, v, low in (("dilation", dilation, 1), ("phases", phases, 1), ("shift", shift, 0)):
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
    taps, cin, n = weight.shape
    if min(taps, cin, n) < 1 or n % phases:
        raise ValueError(
            f"weight must be (taps, C_in, phases * C_out) with phases={phases}, got {tuple(weight.shape)}"
        )
    cout = n // phases
    if padding is None:
        padding = (taps - 1) * dilation // 2
    if not isinstance(padding, int) or isinstance(padding, bool) or padding < 0:
        raise ValueError(f"padding must be an int >= 0, got {padding!r}")
    if pointwise is not None and (phases != 1 or cout > _POINTWISE_MAX):
        raise ValueError(
            f"pointwise needs phases == 1 and C_out <= {_POINTWISE_MAX}, got {phases} and {cout}"
        )
    if not (store_out or out_snake is not None):
        raise ValueError("a layer must store its output, its out_snake, or both")
    if head is not None:
        _check_head(head, weight, cout, phases, shift, out_snake)

    block_k = 64
    cin_p = _padded_size(cin, block_k)
    n_p = max(16, next_power_of_2(n)) if pointwise is not None else _padded_size(n, 128)
    w = weight.new_zeros(taps, cin_p, n_p)
    w[:, :cin, :n] = weight
    pw_alpha = pw_inv_beta = pw_bias = pw_w = None
    if pointwise is not None:
        if pointwise.weight.shape != (cout, cout):
            raise ValueError(
                f"pointwise.weight must be ({cout}, {cout}), got {tuple(pointwise.weight.shape)}"
            )
        pw_w = weight.new_zeros(n_p, n_p)
        pw_w[:cout, :cout] = pointwise.weight
        pw_alpha = _vector(pointwise.snake.alpha, cout, n_p, "pointwise.snake.alpha", weight)
        pw_inv_beta = _vector(
            pointwise.snake.inv_beta, cout, n_p, "pointwise.snake.inv_beta", weight
        )
        pw_bias = _vector(pointwise.bias, cout, n_p, "pointwise.bias", weight)
    bias_p = _vector(bias, n, n_p, "bias", weight)
    head_p, head_w, head_b = 16, None, None
    if head is not None:
        htaps, _, hc = head.weight.shape
        head_p = max(16, next_power_of_2(htaps * hc))
        head_w = weight.new_zeros(n_p, head_p)
        head_w[:cout, : htaps * hc] = head.weight.permute(1, 0, 2).reshape(cout, htaps * hc)
        head_b = _vector(head.bias, hc, next_power_of_2(hc), "head.bias", weight)
    out_alpha = out_inv_beta = None
    if out_snake is not None:
        out_alpha = _vector(out_snake.alpha, cout, cout, "out_snake.alpha", weight)
        out_inv_beta = _vector(out_snake.inv_beta, cout, cout, "out_snake.inv_beta", weight)

    # unused pointers get a float32 stand-in of the right device; the kernel never reads them
    def given(t: torch.Tensor | None) -> torch.Tensor:
        return bias_p if t is None else t

    padded = _Padded(
        w, bias_p, given(pw_alpha), given(pw_inv_beta), given(pw_w), given(pw_bias),
        given(out_alpha), given(out_inv_beta), given(head_w), given(head_b),
    )  # fmt: skip
    return SnakeConv(
        weight, bias, dilation, padding, phases, shift, pointwise, out_snake, bool(store_out),
        head, taps, cin, cout, padded, cin_p, n_p, head_p,
    )  # fmt: skip


def _check_head(head, weight, cout: int, phases: int, shift: int, out_snake) -> None:
    if not isinstance(head, Head):
        raise TypeError(f"head must be a Head, got {type(head).__name__}")
    if phases != 1 or shift or cout > _POINTWISE_MAX or out_snake is None:
        raise ValueError(
            f"head needs phases == 1, shift == 0, C_out <= {_POINTWISE_MAX} and an out_snake, "
            f"got {phases}, {shift}, {cout} and {out_snake is not None}"
        )
    w = head.weight
    if not isinstance(w, torch.Tensor) or w.dim() != 3 or w.shape[1] != cout or min(w.shape) < 1:
        raise ValueError(f"head.weight must be (taps, {cout}, C_head)")
    if w.dtype != weight.dtype or w.device != weight.device:
        raise TypeError(f"head.weight must be {weight.dtype} on {weight.device}, like weight")
    for name, v, low in (("dilation", head.dilation, 1), ("padding", head.padding, 0)):
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ValueError(f"head.{name} must be an int >= {low}, got {v!r}")
    if 2 * head.padding != head.dilation * (w.shape[0] - 1):
        raise ValueError(
            "head must keep the length: 2·padding == dilation·(taps − 1), got "
            f"padding={head.padding}, dilation={head.dilation}, taps={w.shape[0]}"
        )


def _check(
    x: torch.Tensor, layer: SnakeConv, residual: torch.Tensor | None, out_length: int
) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3 or x.shape[2] != layer.in_channels:
        raise ValueError(
            f"x must be (B, L, {layer.in_channels}) channels-last, got {tuple(x.shape)}"
        )
    if x.dtype != layer.weight.dtype or x.device != layer.weight.device:
        raise TypeError(
            f"x must match the layer's weights ({layer.weight.dtype} on {layer.weight.device}), "
            f"got {x.dtype} on {x.device}"
        )
    if not x.is_contiguous():
        raise ValueError("x must be contiguous (B, L, C)")
    if residual is not None:
        want = (x.shape[0], out_length, layer.out_channels)
        if not isinstance(residual, torch.Tensor) or tuple(residual.shape) != want:
            raise ValueError(f"residual must be a tensor of shape {want}")
        if residual.dtype != x.dtype or residual.device != x.device or not residual.is_contiguous():
            raise TypeError(f"residual must be a contiguous {x.dtype} tensor on {x.device}")


def _output(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, dtype=like.dtype, device=like.device)


class Tiles(NamedTuple):
    """A launch's tile sizes, warps, pipeline stages and load cache modifiers."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    a_cache: str = ""
    w_cache: str = ""


def launch_config(layer: SnakeConv, rows: int, interpret: bool) -> Tiles:
    """The :class:`Tiles` of a layer over ``rows`` GEMM rows."""
    whole_row = layer.pointwise is not None or layer.head is not None
    block_n = layer._n_p if whole_row else min(128, layer._n_p)
    block_k = min(64, layer._cin_p)
    if interpret:
        return Tiles(32, block_n, block_k, 4, 1)
    if layer.taps > 1 and layer.phases == 1 and layer.pointwise is None and rows >= 1 << 15:
        return Tiles(128, block_n, block_k, 8, 3)  # wide dilated convolutions over many rows
    # elsewhere (1x1, transposed, the fused residual unit) a smaller tile lets two or three
    # programs share an SM, so one's epilogue overlaps another's main loop (H200 sweep)
    return Tiles(64, block_n, block_k, 4, 3)


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
    out_length = (
        layer.output_length(x.shape[1]) if isinstance(x, torch.Tensor) and x.dim() == 3 else 0
    )
    _check(x, layer, residual, out_length)
    chosen = select_backend(x, residual, backend=backend)
    if not uses_triton(chosen) or x.dtype not in _KERNEL_DTYPES or x.numel() == 0:
        return snake_conv_reference(
            x, layer.weight, layer.bias, dilation=layer.dilation, padding=layer.padding,
            phases=layer.phases, shift=layer.shift, out_length=out_length,
            pointwise=layer.pointwise, residual=residual, out_snake=layer.out_snake,
            store_out=layer.store_out, head=layer.head,
        )  # fmt: skip
    from .kernels import snake_conv_kernel, tap_sum_kernel

    batch, length_in, _ = x.shape
    rows = rows_for(out_length, layer.phases, layer.shift)
    shape = (batch, out_length, layer.out_channels)
    out = _output(shape, x) if layer.store_out else None
    head = layer.head
    activated = None if layer.out_snake is None or head is not None else _output(shape, x)
    partial = None
    if head is not None:
        partial = torch.empty(
            (batch, out_length, layer._head_p), dtype=torch.float32, device=x.device
        )
    interpret = chosen == "interpret"
    tiles = launch_config(layer, rows * batch, interpret)
    k = layer._tensors
    grid = (-(-rows // tiles.block_m), layer._n_p // tiles.block_n, batch)
    snake_conv_kernel[grid](
        x, k.weight, k.bias, k.pw_alpha, k.pw_inv_beta, k.pw_weight, k.pw_bias,
        x if residual is None else residual,
        x if out is None else out,
        x if activated is None else activated,
        k.out_alpha, k.out_inv_beta, k.head_weight, k.bias if partial is None else partial,
        length_in, out_length, rows,
        CIN=layer.in_channels, CIN_P=layer._cin_p, N=layer.phases * layer.out_channels,
        N_P=layer._n_p, COUT=layer.out_channels, TAPS=layer.taps, DIL=layer.dilation,
        PAD=layer.padding, PHASES=layer.phases, SHIFT=layer.shift, HAS_BIAS=layer.bias is not None,
        POINTWISE=layer.pointwise is not None, RESIDUAL=residual is not None,
        STORE_OUT=out is not None, STORE_SNAKE=activated is not None,
        HEAD=head is not None, HEAD_P=layer._head_p, FAST_SIN=not interpret and x.dtype != torch.float32, IEEE=x.dtype == torch.float32,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        A_CACHE=tiles.a_cache, W_CACHE=tiles.w_cache,
        num_warps=tiles.warps, num_stages=tiles.stages,
    )  # fmt: skip
    if head is None:
        return out, activated
    taps, _, channels = head.weight.shape
    audio = _output((batch, out_length, channels), x)
    block_t = 64 if interpret else 512
    tap_sum_kernel[(-(-out_length // block_t), batch)](
        partial, k.head_bias, audio, out_length,
        C=channels, C_P=k.head_bias.shape[0], HEAD_P=layer._head_p, TAPS=taps,
        DIL=head.dilation, PAD=head.padding, BLOCK_T=block_t,
    )  # fmt: skip
    return out, audio
