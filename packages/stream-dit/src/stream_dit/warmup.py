"""Warm-up: run what a session's first ticks will run before the first request arrives.

A tick runs one engine forward over the active rows (the positive rows, then the negative rows of
guided requests) at the engine's bucket of the longest request's frames and of the longest
conditioning, with a frame mask when the rows are shorter than that bucket; then the plain-CFG rows
go through the fused guidance + Euler kernel. What the first call at a new shape costs depends on
the engine: a ``torch.compile`` engine compiles a graph per (batch bucket, T bucket, L bucket,
frame mask present or not), a CUDA-graph engine captures a graph per (batch bucket, T bucket, L
bucket), an eager engine loads the kernels it launches for the first time, and the fused kernel is
compiled per specialisation of its arguments.

:func:`warmup` runs those calls, through the session's own engine, at every row count the session's
ticks can produce and at the frame counts and conditioning lengths named, on scratch tensors of its
own: no request is submitted, no slot is filled, the session's state, caches, counters and ids are
not touched, and no random generator is drawn from. The calls go through
:func:`triton_dispatch.warmup.run_warmup`, one at a time (they share one engine).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from triton_dispatch.warmup import WarmupReport, run_warmup

from .engines.base import Engine
from .ops.guided_euler import guided_euler_
from .session import StreamSession

__all__ = ["StreamWarmupReport", "forward_shapes", "warmup"]


@dataclass
class StreamWarmupReport(WarmupReport):
    """A :class:`~triton_dispatch.warmup.WarmupReport` (wall ``seconds``, ``calls`` run, Triton's
    compile counts) with what the engine did.

    Attributes:
        shapes: the ``(rows, frames, cond_len, frame_mask)`` of every engine forward run.
        forwards: engine forwards run; ``guidance_calls``: fused guidance + Euler calls run.
        graphs_captured: CUDA graphs the engine captured during the warm-up.
        compiled_graphs: graphs ``torch.compile`` built during the warm-up.
    """

    shapes: tuple[tuple[int, int, int, bool], ...] = ()
    forwards: int = 0
    guidance_calls: int = 0
    graphs_captured: int = 0
    compiled_graphs: int = 0
    decoder_calls: int = 0

    def __str__(self) -> str:
        decoder = f", {self.decoder_calls} audio decoder calls" if self.decoder_calls else ""
        return (
            f"warm-up: {self.forwards} engine forwards and {self.guidance_calls} fused guidance "
            f"calls{decoder} in {self.seconds:.2f} s; {self.graphs_captured} CUDA graphs captured, "
            f"{self.compiled_graphs} torch.compile graphs, {self.compiled} Triton kernels "
            f"compiled, {self.loaded} loaded from Triton's cache"
        )


def _ints(name: str, values: int | Iterable[int] | None, default: Sequence[int], lo: int, hi: int):
    if values is None:
        return list(default)
    values = [values] if isinstance(values, int) else list(values)
    if not values:
        raise ValueError(f"{name} must name at least one value, got an empty sequence")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must hold ints, got {v!r}")
        if not lo <= v <= hi:
            raise ValueError(f"{name} must lie in [{lo}, {hi}] (the engine's limits), got {v}")
    return values


def _split(target) -> tuple[StreamSession | None, Engine]:
    if isinstance(target, StreamSession):
        return target, target.engine
    if isinstance(target, Engine):
        return None, target
    raise TypeError(f"warmup takes a StreamSession or an Engine, got {type(target).__name__}")


def forward_shapes(
    target: StreamSession | Engine,
    *,
    frames: int | Iterable[int] | None = None,
    cond_lens: int | Iterable[int] | None = None,
    rows: int | Iterable[int] | None = None,
    cfg: bool = True,
) -> list[tuple[int, int, int, bool]]:
    """The ``(rows, frames, cond_len, frame_mask)`` engine calls :func:`warmup` runs (its arguments
    are those of :func:`warmup`): every row count mapped to the engine's batch bucket, every frame
    count and length to the engine's buckets, a frame mask where a tick would pass one."""
    session, engine = _split(target)
    if session is not None:
        top = min(2 * session.depth, engine.max_batch) if cfg else session.depth
    else:
        top = engine.max_batch
    row_counts = _ints("rows", rows, range(1, top + 1), 1, engine.max_batch)
    frame_counts = _ints("frames", frames, [engine.max_frames], 1, engine.max_frames)
    lengths = _ints("cond_lens", cond_lens, [engine.max_cond_len], 0, engine.max_cond_len)
    bucket = getattr(engine, "batch_bucket", None)
    batches = sorted({bucket(r) if bucket is not None else r for r in row_counts})
    out: set[tuple[int, int, int, bool]] = set()
    for f in frame_counts:
        padded = engine.frames_bucket(f)
        for n in sorted({engine.cond_bucket(length) for length in lengths}):
            for b in batches:  # a mask changes the call (CUDA-graph engines capture both)
                if padded > f:  # every row shorter than the bucket: always a mask
                    out.add((b, padded, n, True))
                    continue
                out.add((b, padded, n, False))  # all rows of the bucket's length
                if b > 1 and padded > 1:  # rows of mixed lengths
                    out.add((b, padded, n, True))
    return sorted(out, key=lambda s: (s[1], s[2], s[0], s[3]))


def _forward_call(engine: Engine, shape, dtypes: dict, cfg: bool) -> Callable[[], None]:
    b, frames, length, masked = shape
    dev = engine.device
    # guided ticks pass null-conditioned negative rows last: engines that skip their
    # cross-attention run a second variant of the call (and capture its graph)
    variants = [None]
    if cfg and b > 1 and getattr(engine, "takes_conditioned_rows", False):
        variants.append(b // 2)

    def call() -> None:
        x = torch.zeros(b, frames, engine.latent_channels, device=dev)
        t = torch.full((b,), 0.5, device=dev)
        states = torch.zeros(b, length, engine.cond_dim, device=dev)
        states_mask = torch.ones(b, length, dtype=torch.bool, device=dev)
        frame_mask = None
        if masked:
            frame_mask = torch.ones(b, frames, dtype=torch.bool, device=dev)
            frame_mask[-1, max(1, frames // 2) :] = False
        context = None
        if engine.context_channels:
            context = torch.zeros(b, frames, engine.context_channels, device=dev)
        for conditioned in variants:
            if conditioned is None:
                out = engine.forward(x, t, states, states_mask, frame_mask, context)
            else:
                states_mask[conditioned:] = False
                out = engine.forward(x, t, states, states_mask, frame_mask, context,
                                     conditioned_rows=conditioned)  # fmt: skip
        dtypes[frames] = out.dtype

    return call


def _guidance_call(state: torch.Tensor, rows: int, frames: int, backend, dtypes: dict):
    def call() -> None:
        dtype = dtypes.get(frames, torch.float32)
        velocity = torch.zeros(2 * rows, frames, state.shape[2], device=state.device, dtype=dtype)
        guided_euler_(
            state,
            velocity,
            list(range(rows)),
            list(range(rows)),
            list(range(rows, 2 * rows)),
            [frames] * rows,
            [1.0] * rows,
            [0.0] * rows,
            backend=backend,
            rows_cache={},  # the session's own row cache stays as it was
        )

    return call


def _torch_compile_graphs() -> int:
    # graphs dynamo has built in this process; 0 while it is not even imported (importing it
    # takes seconds, and an eager engine never needs it)
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return 0
    return int(counters["stats"].get("unique_graphs", 0))


def warmup(
    target: StreamSession | Engine,
    *,
    frames: int | Iterable[int] | None = None,
    cond_lens: int | Iterable[int] | None = None,
    rows: int | Iterable[int] | None = None,
    cfg: bool = True,
) -> StreamWarmupReport:
    """Run the engine forwards and fused guidance calls of the first ticks before they happen.

    Args:
        target: a :class:`~stream_dit.StreamSession` (its engine, depth, fused-CFG setting and
            kernel backend are used) or an :class:`~stream_dit.engines.Engine` alone.
        frames: the latent frame counts the requests will have (each is mapped to the engine's
            T bucket); default: the engine's ``max_frames``.
        cond_lens: the conditioning lengths they will have (longest of ``cond`` and ``negative``;
            mapped to the engine's L bucket); default: the engine's ``max_cond_len``.
        rows: the row counts of a forward; default: every count a tick can produce (1 to twice
            the session's depth, capped at the engine's ceiling; for an engine alone, 1 to its
            ceiling), mapped to the engine's batch buckets.
        cfg: guided requests are expected: negative rows count toward the rows, and the fused
            guidance + Euler kernel runs for 1 to ``depth`` guided rows at each T bucket (unless
            the session has ``fused_cfg=False``). ``False`` warms unguided rows (1 to ``depth``).

    Returns:
        a :class:`StreamWarmupReport`; ``str()`` of it is one line.

    With an audio decoder, the session's decoder also runs once per batch bucket at its window
    length (compiling or capturing those calls). Nothing of the session is modified: no request is queued or admitted, its state, caches,
    counters, handle ids and the random generators stay as they were, so a request served after
    the warm-up gives the same latent as one served without it.
    """
    session, engine = _split(target)
    shapes = forward_shapes(target, frames=frames, cond_lens=cond_lens, rows=rows, cfg=cfg)
    dtypes: dict[int, torch.dtype] = {}
    calls = [_forward_call(engine, s, dtypes, cfg) for s in shapes]
    guidance = 0
    if cfg and (session is None or session.fused_cfg):
        depth = session.depth if session is not None else max(1, engine.max_batch // 2)
        slots = session.state.shape[0] if session is not None else depth
        # a scratch state of the session state's shape (and so strides): the kernel's arguments
        state = torch.zeros(slots, engine.max_frames, engine.latent_channels, device=engine.device)
        backend = session.backend if session is not None else None
        for padded in sorted({s[1] for s in shapes}):
            for k in range(1, depth + 1):
                calls.append(_guidance_call(state, k, padded, backend, dtypes))
                guidance += 1
    decoder = session.decoder if session is not None else None
    decoder_calls = decoder.warmup_calls() if decoder is not None else []
    calls += decoder_calls

    def graphs() -> int:
        own = decoder.engine.captured_graphs if decoder is not None else 0
        return getattr(engine, "captured_graphs", 0) + own

    graphs_before = graphs()
    compiled_before = _torch_compile_graphs()
    with torch.no_grad():
        report = run_warmup(calls, device=engine.device)
    graphs_after = graphs()
    return StreamWarmupReport(
        seconds=report.seconds,
        calls=report.calls,
        compiled=report.compiled,
        loaded=report.loaded,
        compile_seconds=report.compile_seconds,
        by_kernel=report.by_kernel,
        shapes=tuple(shapes),
        forwards=len(shapes),
        guidance_calls=guidance,
        graphs_captured=graphs_after - graphs_before,
        compiled_graphs=max(0, _torch_compile_graphs() - compiled_before),
        decoder_calls=len(decoder_calls),
    )
