"""TensorRT engine (extra ``stream-dit[tensorrt]``): ONNX export with an optimisation profile,
engine build, and execution on its own CUDA stream ordered against PyTorch's current stream.

What has run where: the ONNX export is tested by running the exported graph in onnxruntime against
PyTorch; the execution wrapper (shape setting, address binding, output buffers reused by shape,
event ordering) is tested against a fake TensorRT runtime. Building and executing a real TensorRT
engine has NOT been run by this package's tests: TensorRT could not be installed where they run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

INPUT_NAMES = ("x", "t", "states", "states_mask", "frame_mask")
#: the extra input of models that take context latents (ACE-Step: source latents + chunk mask)
CONTEXT_NAME = "context"
OUTPUT_NAME = "velocity"


def input_names(context_channels: int = 0) -> tuple[str, ...]:
    """The exported graph's inputs: ``INPUT_NAMES``, plus ``context`` for models that take it."""
    return (*INPUT_NAMES, CONTEXT_NAME) if context_channels else INPUT_NAMES


@dataclass(frozen=True)
class OptimizationProfile:
    """(min, opt, max) of the dynamic dimensions: batch rows, latent frames T, conditioning L."""

    batch: tuple[int, int, int] = (1, 8, 16)
    frames: tuple[int, int, int] = (1, 250, 750)
    cond_len: tuple[int, int, int] = (1, 64, 129)

    def __post_init__(self) -> None:
        for name in ("batch", "frames", "cond_len"):
            lo, opt, hi = getattr(self, name)
            if not 1 <= lo <= opt <= hi:
                raise ValueError(f"{name} must satisfy 1 <= min <= opt <= max, got {(lo, opt, hi)}")

    def shapes(
        self, channels: int, cond_dim: int, context_channels: int = 0
    ) -> dict[str, tuple[tuple[int, ...], ...]]:
        """(min, opt, max) shape of every input."""
        out: dict[str, list] = {n: [] for n in input_names(context_channels)}
        for b, t, n in zip(self.batch, self.frames, self.cond_len):
            out["x"].append((b, t, channels))
            out["t"].append((b,))
            out["states"].append((b, n, cond_dim))
            out["states_mask"].append((b, n))
            out["frame_mask"].append((b, t))
            if context_channels:
                out[CONTEXT_NAME].append((b, t, context_channels))
        return {k: tuple(v) for k, v in out.items()}


def _example_inputs(adapter, batch: int, frames: int, cond_len: int, device) -> tuple:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, frames, adapter.latent_channels, generator=gen).to(device)
    t = torch.rand(batch, generator=gen).to(device)
    states = torch.randn(batch, cond_len, adapter.cond_dim, generator=gen).to(device)
    mask = torch.ones(batch, cond_len, dtype=torch.bool, device=device)
    frame_mask = torch.ones(batch, frames, dtype=torch.bool, device=device)
    ctx_channels = getattr(adapter, "context_channels", 0)
    if not ctx_channels:
        return x, t, states, mask, frame_mask
    context = torch.randn(batch, frames, ctx_channels, generator=gen).to(device)
    return x, t, states, mask, frame_mask, context


class _Exported(torch.nn.Module):
    """The adapter with a fixed signature (frame mask always given; context when it takes it)."""

    def __init__(self, adapter) -> None:
        super().__init__()
        self.adapter = adapter

    def forward(self, x, t, states, states_mask, frame_mask, context=None):
        return self.adapter(x, t, states, states_mask, frame_mask, context)


@contextlib.contextmanager
def _sdpa_with_expanded_kv() -> Iterator[None]:
    """Export-time stand-in for grouped-query SDPA: the ONNX exporter has no conversion for
    ``scaled_dot_product_attention(enable_gqa=True)`` (ACE-Step's 16 query / 8 KV heads), so keys
    and values are repeated to the query heads first, which computes the same attention."""
    sdpa = F.scaled_dot_product_attention

    def expanded(query, key, value, *args, enable_gqa: bool = False, **kwargs):
        if enable_gqa and key.shape[-3] != query.shape[-3]:
            groups = query.shape[-3] // key.shape[-3]
            key = key.repeat_interleave(groups, dim=-3)
            value = value.repeat_interleave(groups, dim=-3)
        return sdpa(query, key, value, *args, **kwargs)

    F.scaled_dot_product_attention = expanded
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa


def export_onnx(
    adapter, path: str | Path, profile: OptimizationProfile | None = None, *, opset: int = 18
) -> Path:
    """Export ``adapter`` to ONNX with dynamic batch, T and L (the profile's opt shapes trace it).

    Models with context latents (``adapter.context_channels > 0``) get a sixth input ``context``
    ``(batch, T, context_channels)``. Grouped-query attention is exported with keys and values
    repeated to the query heads.
    """
    profile = profile or OptimizationProfile()
    path = Path(path)
    device = next(adapter.parameters()).device
    example = _example_inputs(
        adapter, profile.batch[1], profile.frames[1], profile.cond_len[1], device
    )
    names = input_names(getattr(adapter, "context_channels", 0))
    dynamic_axes = {
        CONTEXT_NAME: {0: "batch", 1: "frames"},
        "x": {0: "batch", 1: "frames"},
        "t": {0: "batch"},
        "states": {0: "batch", 1: "cond_len"},
        "states_mask": {0: "batch", 1: "cond_len"},
        "frame_mask": {0: "batch", 1: "frames"},
        OUTPUT_NAME: {0: "batch", 1: "frames"},
    }
    if CONTEXT_NAME not in names:
        del dynamic_axes[CONTEXT_NAME]
    # adapters may swap in trace-friendly equivalents of third-party code while exporting
    export_context = getattr(adapter, "export_context", contextlib.nullcontext)
    with torch.no_grad(), _sdpa_with_expanded_kv(), export_context():
        torch.onnx.export(
            _Exported(adapter).eval(),
            example,
            str(path),
            input_names=list(names),
            output_names=[OUTPUT_NAME],
            dynamic_axes=dynamic_axes,
            opset_version=opset,
            dynamo=False,
        )
    return path


def build_engine(
    onnx_path: str | Path,
    profile: OptimizationProfile,
    channels: int,
    cond_dim: int,
    *,
    fp16: bool = True,
    trt: Any = None,
    context_channels: int = 0,
) -> bytes:
    """Build a serialized TensorRT engine from the ONNX file with one optimisation profile."""
    if trt is None:
        import tensorrt as trt
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(Path(onnx_path).read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    opt = builder.create_optimization_profile()
    for name, (lo, mid, hi) in profile.shapes(channels, cond_dim, context_channels).items():
        opt.set_shape(name, lo, mid, hi)
    config.add_optimization_profile(opt)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT engine build failed")
    return bytes(serialized)


class _CudaOrdering:
    """Event ordering between PyTorch's current stream and the engine's stream (no host join)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    @property
    def handle(self) -> int:
        return self.stream.cuda_stream

    def before(self, tensors) -> None:
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(self.device))
        self.stream.wait_event(ready)
        for t in tensors:  # keep the caching allocator from reusing inputs before the engine ran
            t.record_stream(self.stream)

    def after(self) -> None:
        done = torch.cuda.Event()
        done.record(self.stream)
        torch.cuda.current_stream(self.device).wait_event(done)


class TensorRTEngine:
    """Runs a serialized TensorRT engine as a session :class:`~stream_dit.engines.Engine`.

    Inputs are bound by address; the output buffer is kept per (batch, T) shape and reused by the
    next call of that shape (``reuses_output`` is True, so the session copies between CFG passes).

    Args:
        serialized: the engine bytes from :func:`build_engine`.
        profile: the profile it was built with (gives the batch ceiling and T/L limits).
        latent_channels, cond_dim: the model's sizes; ``context_channels``: the width of the
            ``context`` input for engines exported from a model that takes context latents.
        trt: the ``tensorrt`` module (injectable for tests); ``ordering``: the stream ordering
            object (default: a CUDA stream with events).
    """

    reuses_output = True

    def __init__(
        self,
        serialized: bytes,
        profile: OptimizationProfile,
        latent_channels: int,
        cond_dim: int,
        *,
        device: torch.device | str = "cuda",
        trt: Any = None,
        ordering: Any = None,
        context_channels: int = 0,
    ) -> None:
        if trt is None:
            import tensorrt as trt
        self.device = torch.device(device)
        self.profile = profile
        self.latent_channels = latent_channels
        self.cond_dim = cond_dim
        self.context_channels = context_channels
        self.max_batch = profile.batch[2]
        self.max_frames = profile.frames[2]
        self.max_cond_len = profile.cond_len[2] - 1 if profile.cond_len[2] > 1 else 1
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self._engine = self._runtime.deserialize_cuda_engine(serialized)
        if self._engine is None:
            raise RuntimeError("TensorRT could not deserialize the engine")
        self._context = self._engine.create_execution_context()
        self._ordering = ordering if ordering is not None else _CudaOrdering(self.device)
        self._outputs: dict[tuple[int, int], torch.Tensor] = {}
        self._ones: dict[tuple[int, int], torch.Tensor] = {}
        self._zeros: dict[tuple[int, int], torch.Tensor] = {}

    def frames_bucket(self, frames: int) -> int:
        return max(frames, self.profile.frames[0])

    def cond_bucket(self, length: int) -> int:
        return max(length, self.profile.cond_len[0])

    def _check(self, x: torch.Tensor, states: torch.Tensor) -> None:
        b, t = x.shape[:2]
        for name, value, (lo, _, hi) in (
            ("batch", b, self.profile.batch),
            ("T", t, self.profile.frames),
            ("L", states.shape[1], self.profile.cond_len),
        ):
            if not lo <= value <= hi:
                raise ValueError(f"{name}={value} is outside the engine's profile [{lo}, {hi}]")

    def output_buffer(self, batch: int, frames: int) -> torch.Tensor:
        key = (batch, frames)
        out = self._outputs.get(key)
        if out is None:
            out = torch.empty(
                batch, frames, self.latent_channels, device=self.device, dtype=torch.float32
            )
            self._outputs[key] = out
        return out

    def forward(self, x, t, states, states_mask, frame_mask=None, context=None) -> torch.Tensor:
        if context is not None and not self.context_channels:
            raise ValueError("the exported TensorRT engine takes no context latents")
        self._check(x, states)
        b, frames = x.shape[:2]
        if frame_mask is None:
            frame_mask = self._ones.get((b, frames))
            if frame_mask is None:
                frame_mask = torch.ones(b, frames, dtype=torch.bool, device=self.device)
                self._ones[(b, frames)] = frame_mask
        bound = {
            "x": x.float().contiguous(),
            "t": t.float().contiguous(),
            "states": states.float().contiguous(),
            "states_mask": states_mask.to(torch.bool).contiguous(),
            "frame_mask": frame_mask.to(torch.bool).contiguous(),
        }
        if self.context_channels:
            if context is None:
                context = self._zeros.get((b, frames))
                if context is None:
                    context = torch.zeros(b, frames, self.context_channels, device=self.device)
                    self._zeros[(b, frames)] = context
            bound[CONTEXT_NAME] = context.float().contiguous()
        out = self.output_buffer(b, frames)
        ctx = self._context
        for name, tensor in bound.items():
            ctx.set_input_shape(name, tuple(tensor.shape))
            ctx.set_tensor_address(name, tensor.data_ptr())
        ctx.set_tensor_address(OUTPUT_NAME, out.data_ptr())
        self._ordering.before(list(bound.values()))
        if not ctx.execute_async_v3(self._ordering.handle):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        self._ordering.after()
        return out

    __call__ = forward
