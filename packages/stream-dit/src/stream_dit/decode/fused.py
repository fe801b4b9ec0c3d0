"""The Oobleck decoder run as a chain of :func:`~stream_dit.ops.snake_conv.snake_conv` layers.

:class:`FusedOobleck` takes an :class:`~.oobleck.OobleckAdapter` (weight norms folded, Snake
constants computed) and computes what it computes, channels-last: every Snake is applied once,
by the layer that produces its input; a residual unit of up to 128 channels is one launch
(dilated convolution, Snake, 1×1 convolution, residual add, the next Snake); wider units are two;
a transposed convolution is one GEMM whose rows are its stride's phases; the last convolution (to
the audio channels) rides in the last unit's epilogue. Drop-in for the adapter
in :class:`~.engine.DecoderEngine` (same ``forward`` and attributes), so windows, batching and CUDA
graphs work the same.

The first block's levels are narrow (ACE-Step's: 10 samples of 1024 channels per latent frame)
and the last ones wide (1920 samples of 128 channels): a call runs the first block over its whole
input, then the rest in chunks along time, each with the few samples of context its receptive
field needs. Memory then follows the chunk, not the input, so the windows around a call can be
long: a 60 s latent needs 2 windows of 768 frames (1536 frames decoded) instead of 7 of 240
(1680), and the chunks' context costs a fraction of a percent.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import nn

from ..ops.snake_conv import (
    Head,
    Pointwise,
    Snake,
    SnakeConv,
    prepare_snake_conv,
    snake_conv,
    snake_conv_ahead,
)
from .receptive_field import oobleck_receptive_field

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


def _layer_calls(layers, batch: int, channels: int, length: int) -> list[tuple]:
    """``(layer, input shape, residual shape or None)`` of each launch of ``layers`` run (as
    :meth:`FusedOobleck._run` runs them) on ``(batch, length, channels)``."""
    calls = []
    for kind, layer, second in layers:
        shape = (batch, length, channels)
        length = layer.output_length(length)
        out = (batch, length, layer.out_channels)
        if kind == "unit" and second is not None:
            calls += [(layer, shape, None), (second, out, out)]
        else:
            calls.append((layer, shape, out if kind == "unit" else None))
        channels = layer.out_channels
    return calls


class FusedOobleck(nn.Module):
    """The decoder of an :class:`~.oobleck.OobleckAdapter` on fused kernels.

    ``forward(z)`` maps ``(B, latent_channels, T)`` to ``(B, audio_channels, T · hop)`` like the
    adapter; the Snake runs in float32 on the rounded activations, so a low-precision decode
    differs from the adapter's by rounding only.

    Args:
        adapter: the prepared decoder (its weights are copied into the fused layout).
        backend: see :func:`triton_dispatch.select_backend` (``"torch"``: the layers' reference).
        chunk_frames: latent frames of audio per chunk of the levels after the first block (their
            memory is about ``4.25 × 128 · hop × chunk_frames`` activations per batch row for
            ACE-Step's decoder: 535 MB in bf16 at the default); ``None``: no chunks.

    Raises:
        ValueError: ``chunk_frames`` is neither ``None`` nor an int >= 1.
    """

    def __init__(
        self, adapter: nn.Module, *, backend: str | None = None, chunk_frames: int | None = 256
    ) -> None:
        super().__init__()
        if chunk_frames is not None and (
            not isinstance(chunk_frames, int) or isinstance(chunk_frames, bool) or chunk_frames < 1
        ):
            raise ValueError(f"chunk_frames must be None or an int >= 1, got {chunk_frames!r}")
        dec = adapter.decoder
        for name in ("hop", "latent_channels", "audio_channels", "sample_rate", "receptive_field"):
            setattr(self, name, getattr(adapter, name))
        self.backend = backend
        self.chunk_frames = chunk_frames
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
        # the chunked levels start at the second block's upsampling; the first block's Snake
        # output is all they read
        ups = [i for i, (kind, _, _) in enumerate(self._layers) if kind == "up"]
        self._split = ups[1] if len(ups) > 1 else len(self._layers)
        self._split_rate = math.prod(layer.phases for _, layer, _ in self._layers[: self._split])
        self._halo = 0
        if self._split < len(self._layers):
            tail = oobleck_receptive_field(nn.ModuleList([*blocks[1:], dec.snake1, dec.conv2]))
            self._halo = math.ceil(max(tail.left, tail.right) / tail.hop)
        # the widest activation of each part, in channels × samples per latent frame
        self._widest = [0, 0]
        rate = 1
        for i, (_, layer, _) in enumerate(self._layers):
            rate *= layer.phases
            part = int(i >= self._split)
            self._widest[part] = max(self._widest[part], layer.out_channels * rate)
        self._split_channels = self._layers[self._split - 1][1].out_channels
        self._planned: set[tuple[int, int]] = set()  # (batch, frames) whose compiles started

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return self._device

    def chunks(self, frames: int) -> list[tuple[int, int, int, int]]:
        """``(lo, a, b, hi)`` per chunk of a call over ``frames`` latent frames, in samples of the
        first block's output: the chunk decodes ``[lo, hi)`` and keeps ``[a, b)``."""
        total = frames * self._split_rate
        if self._split == len(self._layers) or total == 0:
            return [(0, 0, total, total)]
        size = total if self.chunk_frames is None else self.chunk_frames * self._split_rate
        n = -(-total // size)
        cuts = [i * total // n for i in range(n + 1)]
        return [
            (max(0, a - self._halo), a, b, min(total, b + self._halo))
            for a, b in itertools.pairwise(cuts)
        ]

    def _reserve(self, x: torch.Tensor, chunks: list[tuple[int, int, int, int]]) -> None:
        """Ask the allocator for the call's working set at once, then give it back: the layers'
        tensors are carved from that block and merge back into it when freed, so a CUDA graph's
        private pool (and the cache) holds about the working set. Allocated level by level, each
        level's tensors need segments of their own size and the pool holds about twice as much.
        A unit at the widest level holds its input, its residual and its two outputs."""
        batch, frames, size = x.shape[0], x.shape[1], x.element_size()
        first = 4.25 * self._widest[0] * batch * frames
        longest = max(hi - lo for lo, _, _, hi in chunks) / self._split_rate
        held = self._split_channels * batch * frames * self._split_rate
        held += self.audio_channels * self.hop * batch * frames if len(chunks) > 1 else 0
        rest = held + 4.25 * self._widest[1] * batch * longest
        working = max(first, rest) * size
        torch.empty(int(working) + (1 << 20), dtype=torch.uint8, device=x.device)  # freed now

    def compile_ahead(self, batch: int, frames: int) -> None:
        """Plan every launch of a call on ``(batch, latent_channels, frames)`` and start compiling
        their kernels side by side on background threads (the first call of a shape otherwise
        compiles them one after another as it reaches them). ``forward`` does this on the first
        CUDA call of each shape; a warm-up may call it earlier. Where calls do not compile (the
        interpreter, the CPU) it only plans them."""
        if (batch, frames) in self._planned:
            return
        self._planned.add((batch, frames))
        calls = self._launches(batch, frames)
        # a plan reads only shapes: one scratch buffer serves every call
        largest = max(math.prod(shape) for _, shape, _ in calls)
        scratch = torch.empty(largest, dtype=self._dtype, device=self._device)
        for layer, shape, residual in calls:
            x = scratch[: math.prod(shape)].view(shape)
            r = None if residual is None else scratch[: math.prod(residual)].view(residual)
            snake_conv_ahead(x, layer, residual=r, backend=self.backend)

    def _launches(self, batch: int, frames: int) -> list[tuple]:
        """``(layer, input shape, residual shape or None)`` of every distinct launch of a call."""
        parts = [(self._layers[: self._split], self.latent_channels, frames)]
        lengths = sorted({hi - lo for lo, _, _, hi in self.chunks(frames)})
        parts += [(self._layers[self._split :], self._split_channels, n) for n in lengths]
        return [call for layers, c, n in parts for call in _layer_calls(layers, batch, c, n)]

    def _run(self, layers, x: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
        be = self.backend
        for kind, layer, second in layers:
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
        return activated

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if z.dim() != 3 or z.shape[1] != self.latent_channels:
            raise ValueError(f"z must be (B, {self.latent_channels}, T), got {tuple(z.shape)}")
        x = z.to(self._device, self._dtype).transpose(1, 2).contiguous()
        chunks = self.chunks(x.shape[1])
        if x.is_cuda:
            if not torch.cuda.is_current_stream_capturing():  # no scratch in a graph's pool
                self.compile_ahead(x.shape[0], x.shape[1])
            self._reserve(x, chunks)
        first, rest = self._layers[: self._split], self._layers[self._split :]
        activated = self._run(first, x, x)
        if len(chunks) == 1:
            return self._run(rest, activated, activated).transpose(1, 2)
        # the audio, channels-last; every chunk's kept part is final
        step = self.hop // self._split_rate  # audio samples per sample of the split
        audio = activated.new_empty(x.shape[0], x.shape[1] * self.hop, self.audio_channels)
        for lo, a, b, hi in chunks:
            part = activated[:, lo:hi].contiguous()  # a view when the batch is one row
            out = self._run(rest, part, part)
            audio[:, a * step : b * step] = out[:, (a - lo) * step : (b - lo) * step]
        return audio.transpose(1, 2)  # the audio: from the "out" layer or the last head
