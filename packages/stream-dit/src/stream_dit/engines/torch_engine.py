"""A PyTorch engine: eager, ``torch.compile``d, or replayed from CUDA graphs per batch bucket."""

from __future__ import annotations

from typing import Literal

import torch

from triton_dispatch import next_power_of_2

from ..model.adapter import DenoiserAdapter, check_conditioned_rows
from .base import round_up

Mode = Literal["auto", "eager", "compile", "graphs", "compile-graphs"]
MODES: tuple[str, ...] = ("eager", "compile", "graphs", "compile-graphs")


def resolve_mode(mode: str, device: torch.device) -> str:
    """``"auto"``: CUDA graphs on a CUDA device (a forward of many small kernels is bound by
    host launches when eager), eager elsewhere; any other mode is itself."""
    if mode == "auto":
        return "graphs" if device.type == "cuda" else "eager"
    return mode


class TorchEngine:
    """Runs a :class:`~stream_dit.model.DenoiserAdapter` in PyTorch.

    Args:
        adapter: the denoiser (an ``nn.Module`` in eval mode, on ``device``).
        max_batch: the batch ceiling reported to the session.
        max_frames, max_cond_len: the largest T and L accepted.
        mode: ``"auto"`` (default: ``"graphs"`` on CUDA, ``"eager"`` elsewhere); ``"eager"``;
            ``"compile"`` (``torch.compile`` of the adapter; shapes are bucketed to
            bound recompiles); ``"graphs"`` (one CUDA graph per (batch bucket, T bucket, L bucket,
            frame mask or none), captured on first use; the output buffer is reused by the next
            replay; a batch whose rows all fill the T bucket replays a graph without the mask,
            so the model can take its unmasked path);
            ``"compile-graphs"`` (the ``torch.compile``d adapter captured in those graphs: fused
            pointwise kernels and no launch overhead). With an adapter that takes
            ``conditioned_rows`` (:attr:`takes_conditioned_rows`), a batch whose second half of
            the bucket has no conditioning tokens (CFG's unconditional rows, padded rows) runs
            a variant that skips those rows' cross-attention: a second graph per key.
        frame_multiple, cond_multiple: bucket granularity of T and L in compile/graph modes.
    """

    def __init__(
        self,
        adapter: DenoiserAdapter,
        *,
        max_batch: int = 16,
        max_frames: int = 750,
        max_cond_len: int = 128,
        mode: Mode = "auto",
        device: torch.device | str | None = None,
        frame_multiple: int = 32,
        cond_multiple: int = 16,
    ) -> None:
        if mode not in ("auto", *MODES):
            raise ValueError(f"mode must be one of {('auto', *MODES)}, got {mode!r}")
        for name, value in (
            ("max_batch", max_batch),
            ("max_frames", max_frames),
            ("max_cond_len", max_cond_len),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if device is None:
            device = (
                next(adapter.parameters()).device if isinstance(adapter, torch.nn.Module) else "cpu"
            )
        self.device = torch.device(device)
        mode = resolve_mode(mode, self.device)
        self._graphed = mode in ("graphs", "compile-graphs")
        if self._graphed and self.device.type != "cuda":
            raise ValueError(f"mode={mode!r} needs a CUDA device")
        self.adapter = adapter
        self.mode = mode
        self.max_batch = max_batch
        self.max_frames = max_frames
        self.max_cond_len = max_cond_len
        self.latent_channels = adapter.latent_channels
        self.cond_dim = adapter.cond_dim
        self.context_channels = getattr(adapter, "context_channels", 0)
        self.reuses_output = self._graphed
        #: The adapter takes ``conditioned_rows``, so ``forward`` does (else it ignores them).
        self.takes_conditioned_rows = bool(getattr(adapter, "takes_conditioned_rows", False))
        self._bucketed = mode != "eager"
        self._frame_multiple = frame_multiple
        self._cond_multiple = cond_multiple
        compiled = mode in ("compile", "compile-graphs")
        prepare = getattr(adapter, "prepare", None)
        if callable(prepare):  # an adapter's one-time setup, kept out of traced code
            prepare()
        self._fn = torch.compile(adapter, dynamic=False) if compiled else adapter
        self._graphs: dict[
            tuple[int, int, int, bool, int], tuple[torch.cuda.CUDAGraph, dict, torch.Tensor]
        ] = {}
        self._pool = None

    def frames_bucket(self, frames: int) -> int:
        if not self._bucketed:
            return frames
        return min(round_up(frames, self._frame_multiple), max(self.max_frames, frames))

    def cond_bucket(self, length: int) -> int:
        if not self._bucketed:
            return max(length, 1)
        return min(round_up(length, self._cond_multiple), max(self.max_cond_len, length, 1))

    @property
    def captured_graphs(self) -> int:
        """CUDA graphs captured so far (one per (batch bucket, T, L, masked) key; 0 outside graph
        modes)."""
        return len(self._graphs)

    def batch_bucket(self, batch: int) -> int:
        return min(next_power_of_2(batch), self.max_batch) if self._bucketed else batch

    def _check(self, x: torch.Tensor, states: torch.Tensor) -> None:
        if x.shape[0] > self.max_batch:
            raise ValueError(f"batch {x.shape[0]} exceeds the engine's ceiling {self.max_batch}")
        if x.shape[1] > self.max_frames:
            raise ValueError(f"T={x.shape[1]} exceeds the engine's limit {self.max_frames}")
        if states.shape[1] > self.max_cond_len + 1:
            raise ValueError(f"L={states.shape[1]} exceeds the engine's limit {self.max_cond_len}")

    def conditioned_bucket(self, batch: int, conditioned_rows: int | None) -> int:
        """The rows of the batch bucket that run their cross-attention: the whole bucket, or
        its first half when the rows after it have no conditioning tokens (a bucket's padded
        rows never have any). Two variants per bucket bound the graphs and compiles."""
        bb = self.batch_bucket(batch)
        if not self.takes_conditioned_rows:
            return bb
        rows = batch if conditioned_rows is None else min(conditioned_rows, batch)
        return bb // 2 if bb > 1 and rows <= bb // 2 else bb

    @torch.no_grad()
    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        states: torch.Tensor,
        states_mask: torch.Tensor,
        frame_mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        *,
        conditioned_rows: int | None = None,
    ) -> torch.Tensor:
        """The adapter's velocity for a batch. ``conditioned_rows``: a promise that the rows
        from this index on have no conditioning tokens (their ``states_mask`` is all False);
        an adapter that takes it skips their cross-attention (``None``: no promise)."""
        self._check(x, states)
        check_conditioned_rows(conditioned_rows, x.shape[0])
        if not self._graphed:
            if self._bucketed:
                return self._padded_call(x, t, states, states_mask, frame_mask, context,
                                         conditioned_rows)  # fmt: skip
            extra = {}
            if self.takes_conditioned_rows and conditioned_rows is not None:
                extra["conditioned_rows"] = conditioned_rows
            return self._fn(x, t, states, states_mask, frame_mask, context, **extra)
        return self._replay(x, t, states, states_mask, frame_mask, context, conditioned_rows)

    def _conditioned_kwargs(self, bb: int, conditioned: int) -> dict:
        # the whole bucket conditioned: the call the adapter always took
        return {"conditioned_rows": conditioned} if conditioned < bb else {}

    def _padded_call(self, x, t, states, states_mask, frame_mask, context, conditioned_rows):
        b = x.shape[0]
        bb = self.batch_bucket(b)
        extra = self._conditioned_kwargs(bb, self.conditioned_bucket(b, conditioned_rows))
        if bb == b:
            return self._fn(x, t, states, states_mask, frame_mask, context, **extra)
        pad = bb - b
        x = torch.cat([x, x.new_zeros(pad, *x.shape[1:])])
        t = torch.cat([t, t.new_ones(pad)])
        states = torch.cat([states, states.new_zeros(pad, *states.shape[1:])])
        states_mask = torch.cat([states_mask, states_mask.new_zeros(pad, states_mask.shape[1])])
        if frame_mask is not None:
            frame_mask = torch.cat([frame_mask, frame_mask.new_ones(pad, frame_mask.shape[1])])
        if context is not None:
            context = torch.cat([context, context.new_zeros(pad, *context.shape[1:])])
        return self._fn(x, t, states, states_mask, frame_mask, context, **extra)[:b]

    def _static_inputs(self, bb: int, frames: int, length: int, masked: bool, x, states) -> dict:
        dev = self.device
        inputs = {
            "x": torch.zeros(bb, frames, x.shape[2], device=dev, dtype=x.dtype),
            "t": torch.ones(bb, device=dev, dtype=torch.float32),
            "states": torch.zeros(bb, length, states.shape[2], device=dev, dtype=states.dtype),
            "states_mask": torch.zeros(bb, length, device=dev, dtype=torch.bool),
            "frame_mask": torch.ones(bb, frames, device=dev, dtype=torch.bool) if masked else None,
            "context": None,
        }
        if self.context_channels:
            inputs["context"] = torch.zeros(bb, frames, self.context_channels, device=dev)
        return inputs

    def capture(
        self,
        batch: int,
        frames: int,
        length: int,
        masked: bool = True,
        conditioned_rows: int | None = None,
    ) -> None:
        """Capture (once) the graph of a (batch bucket, T, L, masked, conditioned rows) key;
        later calls replay it. ``masked``: the calls pass a frame mask (rows shorter than T);
        ``conditioned_rows``: as in :meth:`forward`."""
        bb = self.batch_bucket(batch)
        conditioned = self.conditioned_bucket(batch, conditioned_rows)
        key = (bb, frames, length, masked, conditioned)
        if key in self._graphs:
            return
        extra = self._conditioned_kwargs(bb, conditioned)
        probe_x = torch.empty(0, 0, self.latent_channels, device=self.device)
        probe_s = torch.empty(0, 0, self.cond_dim, device=self.device)
        inputs = self._static_inputs(bb, frames, length, masked, probe_x, probe_s)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside the graph (allocations, cuBLAS, compilation)
                self._fn(**inputs, **extra)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._fn(**inputs, **extra)
        self._graphs[key] = (graph, inputs, out)

    def _replay(self, x, t, states, states_mask, frame_mask, context, conditioned_rows):
        b, frames = x.shape[:2]
        length = states.shape[1]
        bb = self.batch_bucket(b)
        masked = frame_mask is not None
        key = (bb, frames, length, masked, self.conditioned_bucket(b, conditioned_rows))
        if key not in self._graphs:
            self.capture(b, frames, length, masked, conditioned_rows)
        graph, inputs, out = self._graphs[key]
        inputs["x"][:b].copy_(x)
        inputs["t"][:b].copy_(t)
        inputs["states"][:b].copy_(states)
        inputs["states_mask"][:b].copy_(states_mask)
        if masked:
            inputs["frame_mask"][:b].copy_(frame_mask)
        if inputs["context"] is not None:
            if context is None:
                inputs["context"][:b].zero_()
            else:
                inputs["context"][:b].copy_(context)
        graph.replay()
        return out[:b]

    __call__ = forward
