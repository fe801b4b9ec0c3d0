"""Runs an audio decoder on batches of equal-length windows: eager, ``torch.compile``d, or replayed
from CUDA graphs, the way :class:`~stream_dit.engines.TorchEngine` runs the DiT."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

import torch
from torch import nn

from triton_dispatch import next_power_of_2

DecoderMode = Literal["eager", "compile", "graphs", "compile-graphs", "fused", "fused-graphs"]
DECODER_MODES: tuple[str, ...] = (
    "eager", "compile", "graphs", "compile-graphs", "fused", "fused-graphs",
)  # fmt: skip

__all__ = ["AUDIO_FORMAT", "DECODER_MODES", "DecoderEngine"]

#: What an adapter tells about its audio; the engine and the decoder stage expose it too.
AUDIO_FORMAT: tuple[str, ...] = ("hop", "latent_channels", "audio_channels", "sample_rate")


class DecoderEngine:
    """Calls ``adapter(z)`` for ``z`` of shape ``(B, latent_channels, L)``.

    Args:
        adapter: the decoder (an :class:`~stream_dit.decode.oobleck.OobleckAdapter`, a
            :class:`~stream_dit.decode.fused.FusedOobleck`, or any module with ``hop``,
            ``latent_channels``, ``audio_channels``, ``sample_rate`` and ``receptive_field``, and
            ``device`` and ``dtype`` or parameters), in eval mode on its device.
        max_batch: the most windows one call takes.
        mode: ``"eager"``; ``"compile"`` (``torch.compile`` of the adapter, batches padded to
            power-of-two buckets so few shapes compile); ``"graphs"`` (one CUDA graph per (batch
            bucket, window length), captured on first use; the output is overwritten by the next
            call); ``"compile-graphs"`` (the compiled adapter captured in those graphs);
            ``"fused"`` (an Oobleck adapter run by :class:`~stream_dit.decode.fused.FusedOobleck`'s
            Triton kernels: 3.3x the eager adapter on an H200, and closer to a float32 decode);
            ``"fused-graphs"`` (those kernels captured in CUDA graphs).
        graph_lengths: window lengths worth a graph or a compiled graph: other lengths (a
            request shorter than one window) run the plain adapter, so odd lengths neither hold a
            graph's memory nor recompile. ``None``: every length gets one.
        cudnn_benchmark: let cuDNN time its convolution algorithms for each window shape during
            the engine's calls (``torch.backends.cudnn.benchmark``, set for the call and put
            back). The windows' shapes are few and fixed, so each is timed once; on an H200 it
            took two windows of 128 frames per call from 58.0 to 43.9 ms per 60 s of audio.
    """

    def __init__(
        self,
        adapter: nn.Module,
        *,
        max_batch: int = 4,
        mode: DecoderMode = "eager",
        graph_lengths: tuple[int, ...] | None = None,
        cudnn_benchmark: bool = True,
    ) -> None:
        if mode not in DECODER_MODES:
            raise ValueError(f"mode must be one of {DECODER_MODES}, got {mode!r}")
        if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
            raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")
        if mode in ("fused", "fused-graphs"):
            from .fused import FusedOobleck

            if not isinstance(adapter, FusedOobleck):
                if not hasattr(adapter, "decoder"):
                    raise TypeError(
                        f"mode={mode!r} needs an OobleckAdapter, got {type(adapter).__name__}"
                    )
                adapter = FusedOobleck(adapter)
        for name in AUDIO_FORMAT:
            if not isinstance(getattr(adapter, name, None), int):
                raise TypeError(f"adapter must have an int attribute {name!r}")
            setattr(self, name, getattr(adapter, name))
        if isinstance(getattr(adapter, "dtype", None), torch.dtype):
            self.device, self.dtype = torch.device(adapter.device), adapter.dtype
        else:
            param = next(adapter.parameters())
            self.device, self.dtype = param.device, param.dtype
        self._graphed = mode in ("graphs", "compile-graphs", "fused-graphs")
        if self._graphed and self.device.type != "cuda":
            raise ValueError(f"mode={mode!r} needs the decoder on a CUDA device")
        self.adapter = adapter
        self.mode = mode
        self.max_batch = max_batch
        self.receptive_field = adapter.receptive_field
        self.graph_lengths = None if graph_lengths is None else tuple(graph_lengths)
        self.reuses_output = self._graphed
        self.cudnn_benchmark = bool(cudnn_benchmark)
        compiled = mode in ("compile", "compile-graphs")
        self._fn = torch.compile(adapter, dynamic=False) if compiled else adapter
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]]
        self._graphs = {}
        self._pool = None

    @property
    def captured_graphs(self) -> int:
        """CUDA graphs captured so far (one per (batch bucket, window length))."""
        return len(self._graphs)

    def graph_memory_bytes(self) -> int:
        """Device memory the captured graphs hold between calls: the segments of their shared
        private pool (intermediates and outputs) plus their static inputs; 0 before a capture."""
        if self._pool is None:
            return 0
        pool = tuple(self._pool)
        held = sum(
            s["total_size"]
            for s in torch.cuda.memory_snapshot()
            if tuple(s.get("segment_pool_id", ())) == pool
        )
        return held + sum(static.nbytes for _, static, _ in self._graphs.values())

    def batch_bucket(self, batch: int) -> int:
        if self.mode in ("eager", "fused"):
            return batch
        return min(next_power_of_2(batch), self.max_batch)

    def _special(self, length: int) -> bool:
        return self.graph_lengths is None or length in self.graph_lengths

    @contextlib.contextmanager
    def _cudnn_timing(self) -> Iterator[None]:
        previous = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = previous or self.cudnn_benchmark
        try:
            yield
        finally:
            torch.backends.cudnn.benchmark = previous

    @torch.no_grad()
    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Audio ``(B, audio_channels, L · hop)`` in the decoder's dtype (``z`` is cast to it)."""
        if z.dim() != 3 or z.shape[1] != self.latent_channels:
            raise ValueError(
                f"z must be (B, {self.latent_channels}, L), got shape {tuple(z.shape)}"
            )
        if z.shape[0] > self.max_batch:
            raise ValueError(f"batch {z.shape[0]} exceeds the decoder's ceiling {self.max_batch}")
        z = z.to(self.device, self.dtype)
        with self._cudnn_timing():
            return self._run(z)

    def _run(self, z: torch.Tensor) -> torch.Tensor:
        b, _, length = z.shape
        if not self._special(length):
            return self.adapter(z)
        if self._graphed:
            return self._replay(z)
        bb = self.batch_bucket(b)
        if bb != b:
            z = torch.cat([z, z.new_zeros(bb - b, *z.shape[1:])])
        return self._fn(z)[:b]

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        return self.forward(z)

    def capture(self, batch: int, length: int) -> None:
        """Capture (once) the CUDA graph of a (batch bucket, window length); later calls replay it."""
        with self._cudnn_timing():
            self._capture(batch, length)

    def _capture(self, batch: int, length: int) -> None:
        bb = self.batch_bucket(batch)
        key = (bb, length)
        if key in self._graphs:
            return
        static = torch.zeros(bb, self.latent_channels, length, device=self.device, dtype=self.dtype)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # allocations, cuDNN algorithm choice, compilation: outside
                self._fn(static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._fn(static)
        self._graphs[key] = (graph, static, out)

    def _replay(self, z: torch.Tensor) -> torch.Tensor:
        b, _, length = z.shape
        key = (self.batch_bucket(b), length)
        if key not in self._graphs:
            self.capture(b, length)
        graph, static, out = self._graphs[key]
        static[:b].copy_(z)  # rows are independent: stale rows past b change nothing we return
        graph.replay()
        return out[:b]
