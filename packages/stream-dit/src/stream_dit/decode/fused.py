"""The Oobleck decoder run as a chain of :func:`~stream_dit.ops.snake_conv.snake_conv` layers.

:class:`FusedOobleck` takes an :class:`~.oobleck.OobleckAdapter` (weight norms folded, Snake
constants computed) and computes what it computes, channels-last: every Snake is applied once,
by the layer that produces its input; a residual unit of up to 128 channels is one launch
(dilated convolution, Snake, 1×1 convolution, residual add, the next Snake); wider units are two;
a transposed convolution is one GEMM whose rows are its stride's phases; the last convolution (to
the audio channels) rides in the last unit's epilogue. Drop-in for the adapter
in :class:`~.engine.DecoderEngine` (same ``forward`` and attributes), so windows, batching and CUDA
graphs work the same.
"""

from __future__ import annotations

import torch
from torch import nn

from ..ops.snake_conv import Head, Pointwise, Snake, SnakeConv, prepare_snake_conv, snake_conv

__all__ = ["FusedOobleck"]


def _snake_of(module: nn.Module) -> Snake:
    return Snake(module.alpha.reshape(-1).float(), module.inv_beta.reshape(-1).float())


def _conv(conv: nn.Conv1d, **kw) -> SnakeConv:
    # (C_out, C_in, taps) -> (taps, C_in, C_out): each tap a GEMM operand, rows = input channels
    return prepare_snake_conv(
        conv.weight.permute(2, 1, 0).contiguous(), conv.bias,
        dilation=conv.dilation[0], padding=conv.padding[0], **kw,
    )  # fmt: skip


def _transposed(conv: nn.ConvTranspose1d, **kw) -> SnakeConv:
    stride, (cin, cout, k) = conv.stride[0], conv.weight.shape
    if (
        k != 2 * stride
        or conv.padding[0] > stride
        or conv.output_padding[0]
        or conv.dilation[0] != 1
    ):
        raise ValueError(
            "only transposed convolutions with kernel 2·stride (Oobleck's) are supported"
        )
    # output t = q·stride + r − padding takes x[q] · w[..., r] and x[q − 1] · w[..., r + stride]:
    # tap 0 reads row q − 1, tap 1 row q; columns r·C_out + c
    w = conv.weight.reshape(cin, cout, 2, stride).permute(2, 0, 3, 1).flip(0)
    bias = None if conv.bias is None else conv.bias.repeat(stride)
    return prepare_snake_conv(
        w.reshape(2, cin, stride * cout).contiguous(), bias,
        padding=1, phases=stride, shift=conv.padding[0], **kw,
    )  # fmt: skip


def _unit(unit, nxt: Snake, final: nn.Conv1d | None) -> tuple[SnakeConv, SnakeConv | None]:
    """A residual unit's one or two launches. The last unit's (``final`` given: the decoder's
    last convolution) output is read by nobody but its Snake, and that only by ``final``: a unit
    of up to 128 channels takes ``final`` as its head, so neither is ever written."""
    pw = Pointwise(
        _snake_of(unit.snake2), unit.conv2.weight[:, :, 0].t().contiguous(), unit.conv2.bias
    )
    last = {} if final is None else {"store_out": False}
    if unit.conv2.out_channels <= 128:
        head = None
        if final is not None:
            head = Head(
                final.weight.permute(2, 1, 0).contiguous(), final.bias,
                final.dilation[0], final.padding[0],
            )  # fmt: skip
        return _conv(unit.conv1, pointwise=pw, out_snake=nxt, head=head, **last), None
    first = _conv(unit.conv1, out_snake=pw.snake, store_out=False)
    return first, prepare_snake_conv(pw.weight[None], pw.bias, out_snake=nxt, **last)


class FusedOobleck(nn.Module):
    """The decoder of an :class:`~.oobleck.OobleckAdapter` on fused kernels.

    ``forward(z)`` maps ``(B, latent_channels, T)`` to ``(B, audio_channels, T · hop)`` like the
    adapter; the Snake runs in float32 on the rounded activations, so a low-precision decode
    differs from the adapter's by rounding only.

    Args:
        adapter: the prepared decoder (its weights are copied into the fused layout).
        backend: see :func:`triton_dispatch.select_backend` (``"torch"``: the layers' reference).
    """

    def __init__(self, adapter: nn.Module, *, backend: str | None = None) -> None:
        super().__init__()
        dec = adapter.decoder
        for name in ("hop", "latent_channels", "audio_channels", "sample_rate", "receptive_field"):
            setattr(self, name, getattr(adapter, name))
        self.backend = backend
        self._dtype, self._device = adapter.dtype, adapter.device
        blocks = list(dec.block)
        # the Snake each layer's output feeds, in order of the layers that produce them
        consumers = []
        for blk in blocks:
            units = (blk.res_unit1, blk.res_unit2, blk.res_unit3)
            consumers.append(blk.snake1)
            consumers.extend(unit.snake1 for unit in units)
        consumers.append(dec.snake1)
        follow = iter(consumers)
        self._layers: list[tuple[str, SnakeConv, SnakeConv | None]] = []
        self._layers.append(
            ("in", _conv(dec.conv1, out_snake=_snake_of(next(follow)), store_out=False), None)
        )
        units = [u for blk in blocks for u in (blk.res_unit1, blk.res_unit2, blk.res_unit3)]
        for blk in blocks:
            self._layers.append(
                ("up", _transposed(blk.conv_t1, out_snake=_snake_of(next(follow))), None)
            )
            for unit in (blk.res_unit1, blk.res_unit2, blk.res_unit3):
                final = dec.conv2 if unit is units[-1] else None
                self._layers.append(("unit", *_unit(unit, _snake_of(next(follow)), final)))
        if self._layers[-1][1].head is None:
            self._layers.append(("out", _conv(dec.conv2), None))
        # the widest activation, in channels × samples per latent frame
        widest, rate = 0, 1
        for _, layer, _ in self._layers:
            rate *= layer.phases
            widest = max(widest, layer.out_channels * rate)
        self._widest = widest

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return self._device

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if z.dim() != 3 or z.shape[1] != self.latent_channels:
            raise ValueError(f"z must be (B, {self.latent_channels}, T), got {tuple(z.shape)}")
        x = activated = z.to(self._device, self._dtype).transpose(1, 2).contiguous()
        be = self.backend
        if x.is_cuda:
            # Ask the allocator for the whole working set at once (a unit at the widest level
            # holds its input, its residual and its two outputs), then give it back: the layers'
            # smaller tensors are carved from that block and merge back into it when freed, so a
            # CUDA graph's private pool (and the cache) holds about the working set. Allocated
            # level by level, each level's tensors need segments of their own size and the pool
            # holds about twice as much.
            working = 4.25 * self._widest * x.shape[0] * x.shape[1] * x.element_size()
            torch.empty(int(working) + (1 << 20), dtype=torch.uint8, device=x.device)  # freed now
        for kind, layer, second in self._layers:
            if kind == "unit" and second is None:
                x, activated = snake_conv(activated, layer, residual=x, backend=be)
            elif kind == "unit":
                _, hidden = snake_conv(activated, layer, backend=be)
                x, activated = snake_conv(hidden, second, residual=x, backend=be)
            elif kind == "up":
                x, activated = snake_conv(activated, layer, backend=be)
            elif kind == "in":
                _, activated = snake_conv(x, layer, backend=be)
            else:
                activated, _ = snake_conv(activated, layer, backend=be)
        return activated.transpose(1, 2)  # the audio: from the "out" layer or the last head
