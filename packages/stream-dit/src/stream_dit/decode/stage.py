"""The session's decoder stage: finished latents to audio, window by window, batched across
requests, on a CUDA stream of its own.

:class:`AudioDecoder` keeps a queue of latents to decode. Each ``step()`` (the session calls it at
the end of every tick) launches the pending windows, oldest request first, ``batch_windows``
windows of one length per decoder call, windows of different requests side by side; it stitches
each window's audio into the final samples it completes (:class:`~.windows.Stitcher`) and copies
them into the request's host buffer. On CUDA all of that is queued on the decoder's own stream
(ordered after the tick that finished the latent by an event), so the GPU decodes while the next
ticks denoise; a later ``step()`` notices, without waiting, which calls have finished and tells
the handles. On the host it runs inline.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .engine import AUDIO_FORMAT, DecoderEngine
from .windows import Stitcher, WindowPlan, plan_windows

if TYPE_CHECKING:
    from ..handle import Handle

__all__ = ["AudioDecoder"]


@dataclass(eq=False)  # identity: jobs are found in queues by `is`, never by their tensors
class _Job:
    handle: Handle
    latent: torch.Tensor  # (latent_channels, T) on the decoder's device
    plan: WindowPlan
    stitch: Stitcher
    host: torch.Tensor  # (T · hop, audio_channels) float32, pinned on CUDA
    ready: torch.cuda.Event | None = None  # the latent is final on the session's stream
    next: int = 0  # next window to launch
    failed: bool = False


@dataclass(eq=False)
class _Launch:
    event: torch.cuda.Event | None
    updates: list[tuple[_Job, int]] = field(default_factory=list)  # (job, final samples)


def default_window(mode: str) -> int:
    """Latent frames per window for a :class:`DecoderEngine` mode: 768 for the fused decoder (it
    runs the wide levels in chunks, so a long window costs no memory and a 60 s latent is 2
    windows: 2.4 % more frames than the audio instead of 12 % at 7 windows of 240), 256 for the
    others, whose memory grows with the window."""
    return 768 if mode in ("fused", "fused-graphs") else 256


class AudioDecoder:
    """Decode finished latents to audio in overlapping windows with a crossfade.

    Args:
        engine: a :class:`~stream_dit.decode.engine.DecoderEngine`, or a decoder adapter (wrapped
            in an eager engine with ``max_batch=batch_windows``).
        window: latent frames per window (shorter latents are decoded whole). With ``context``
            and ``batch_windows`` it bounds the decoder's memory: one call sees
            ``batch_windows × window`` frames, whatever the audio's length. ``None``:
            :func:`default_window` of the engine's mode (768 for the fused decoder, whose memory
            follows its chunks; 256 otherwise).
        window_align: a latent's windows are shortened to the shortest multiple of this many
            frames that needs no more windows (less work than full windows, few distinct
            lengths); ``0`` keeps them all at ``window`` frames.
        context: frames kept on each side of a window's kept part; ``None`` derives it from the
            decoder's receptive field, which makes the result equal the full decode (to float
            rounding). Smaller saves compute, and the crossfade then hides the seams.
        crossfade: frames over which neighbouring windows are blended linearly.
        batch_windows: windows per decoder call (default: the engine's ``max_batch``).
        max_windows_per_step: windows launched per ``step()`` (``None``: all pending).
        stream: the CUDA stream to decode on (default: a new one on the engine's device; ignored
            on the host).

    Raises:
        ValueError / TypeError: for a bad argument, naming it.
    """

    def __init__(
        self,
        engine: DecoderEngine | torch.nn.Module,
        *,
        window: int | None = None,
        context: int | None = None,
        crossfade: int = 1,
        window_align: int = 16,
        batch_windows: int | None = None,
        max_windows_per_step: int | None = None,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        if not isinstance(engine, DecoderEngine):
            if not isinstance(engine, torch.nn.Module):
                raise TypeError(
                    f"engine must be a DecoderEngine or a decoder module, got {type(engine).__name__}"
                )
            engine = DecoderEngine(engine, max_batch=batch_windows or 4)
        if context is None:
            context = engine.receptive_field.context_frames()
        if window is None:
            window = default_window(engine.mode)
        batch_windows = engine.max_batch if batch_windows is None else batch_windows
        if not isinstance(batch_windows, int) or not 1 <= batch_windows <= engine.max_batch:
            raise ValueError(
                f"batch_windows must be an int in [1, {engine.max_batch}] (the engine's "
                f"max_batch), got {batch_windows!r}"
            )
        if max_windows_per_step is not None and (
            not isinstance(max_windows_per_step, int) or max_windows_per_step < 1
        ):
            raise ValueError(
                f"max_windows_per_step must be None or an int >= 1, got {max_windows_per_step!r}"
            )
        plan_windows(window + 1, window, context, crossfade, align=window_align)  # validates them
        self.engine = engine
        self.window, self.context, self.crossfade = window, context, crossfade
        self.window_align = window_align
        self.batch_windows = batch_windows
        self.max_windows_per_step = max_windows_per_step
        self.device = engine.device
        for name in AUDIO_FORMAT:
            setattr(self, name, getattr(engine, name))
        self._cuda = self.device.type == "cuda"
        self.stream = (stream or torch.cuda.Stream(self.device)) if self._cuda else None
        self._pending: deque[_Job] = deque()  # windows left to launch
        self._in_flight: deque[_Launch] = deque()
        self.windows_decoded = 0
        self.calls = 0

    @property
    def idle(self) -> bool:
        """Nothing left to launch and nothing on the device unreported."""
        return not self._pending and not self._in_flight

    @property
    def pending_windows(self) -> int:
        return sum(job.plan.windows - job.next for job in self._pending)

    def warmup_calls(self) -> list[Callable[[], None]]:
        """One decoder call per batch bucket at the window length, on the decoder's stream:
        what compiles or captures the calls of the first decodes (for
        :func:`stream_dit.warmup.warmup`). Shorter aligned window lengths are compiled or
        captured when a latent first needs them."""
        engine = self.engine
        buckets = sorted({engine.batch_bucket(b) for b in range(1, self.batch_windows + 1)})

        def call(b: int) -> None:
            z = torch.zeros(b, self.latent_channels, self.window, device=self.device)
            if self._cuda:
                self.stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(self.stream):
                    engine(z)
                self.stream.synchronize()
            else:
                engine(z)

        return [lambda b=b: call(b) for b in buckets]

    def plan(self, frames: int) -> WindowPlan:
        """The windows a latent of ``frames`` frames is decoded in."""
        return plan_windows(
            frames, self.window, self.context, self.crossfade, align=self.window_align
        )

    def submit(self, handle: Handle, latent: torch.Tensor) -> None:
        """Queue ``latent`` ``(T, latent_channels)`` (as the session holds it) for decoding into
        ``handle.audio``: a ``(audio_channels, T · hop)`` float32 host tensor filled in order;
        ``handle.audio_samples`` counts the samples that are final."""
        if latent.dim() != 2 or latent.shape[1] != self.latent_channels:
            raise ValueError(
                f"latent must be (T, {self.latent_channels}), got shape {tuple(latent.shape)}"
            )
        plan = self.plan(latent.shape[0])
        # samples-major, so the piece each window completes is one contiguous (async) copy
        host = torch.empty(plan.frames * self.hop, self.audio_channels, pin_memory=self._cuda)
        z = latent.detach().t()
        ready = None
        if self._cuda and latent.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(latent.device))
            # the decoder stream reads it after the caller may have dropped it
            latent.record_stream(self.stream)
        handle.audio = host.t()
        handle.audio_samples = 0
        handle.audio_error = None
        self._pending.append(_Job(handle, z, plan, Stitcher(plan, self.hop), host, ready))

    def step(self, *, wait: bool = False) -> None:
        """Report finished decoder calls to their handles, then launch pending windows. With
        ``wait`` (nothing else to do on the device), block until the oldest call finishes
        first."""
        self._poll(wait=wait)
        budget = self.max_windows_per_step
        while self._pending and (budget is None or budget > 0):
            n = self.batch_windows if budget is None else min(budget, self.batch_windows)
            batch = self._take(n)
            if not batch:
                break
            if budget is not None:
                budget -= len(batch)
            self._launch(batch)
        if not self._cuda:
            self._poll(wait=False)

    def drain(self) -> None:
        """Launch and finish everything queued (blocking)."""
        while not self.idle:
            self.step(wait=True)

    def _take(self, n: int) -> list[tuple[_Job, int]]:
        """Up to ``n`` next windows of one length, oldest request first; drops cancelled jobs."""
        batch: list[tuple[_Job, int]] = []
        length = None
        for job in list(self._pending):
            if job.handle._cancel_requested or job.failed:
                self._pending.remove(job)
                job.handle.audio_error = job.handle.audio_error or RuntimeError("cancelled")
                job.handle._notify()
                continue
            if length is None:
                length = job.plan.length
            if job.plan.length != length:
                continue
            while job.next < job.plan.windows and len(batch) < n:
                batch.append((job, job.next))
                job.next += 1
            if job.next == job.plan.windows:
                self._pending.remove(job)
            if len(batch) == n:
                break
        return batch

    def _launch(self, batch: list[tuple[_Job, int]]) -> None:
        launch = _Launch(event=None)
        context = torch.cuda.stream(self.stream) if self._cuda else contextlib.nullcontext()
        try:
            with context:
                for job in {id(j): j for j, _ in batch}.values():
                    if job.ready is not None:
                        self.stream.wait_event(job.ready)
                        job.ready = None
                z = torch.stack([j.latent[:, _span(j.plan, k)] for j, k in batch])
                audio = self.engine(z)
                for i, (job, k) in enumerate(batch):
                    piece = job.stitch.add(k, audio[i])
                    end = job.stitch.done
                    job.host[end - piece.shape[-1] : end].copy_(piece.t(), non_blocking=self._cuda)
                    launch.updates.append((job, end))
                if self._cuda:
                    launch.event = torch.cuda.Event()
                    launch.event.record(self.stream)
        except Exception as exc:  # a failed call fails the requests it carried, not the session
            for job, _ in batch:
                self._fail(job, exc)
            return
        self.calls += 1
        self.windows_decoded += len(batch)
        self._in_flight.append(launch)

    def _fail(self, job: _Job, exc: BaseException) -> None:
        if job.failed:
            return
        job.failed = True
        if job in self._pending:
            self._pending.remove(job)
        job.handle.audio_error = exc
        job.handle._notify()

    def _poll(self, *, wait: bool) -> None:
        while self._in_flight:
            launch = self._in_flight[0]
            if launch.event is not None and not launch.event.query():
                if not wait:
                    return
                launch.event.synchronize()
                wait = False  # one wait per step: then report what else has finished
            self._in_flight.popleft()
            for job, samples in launch.updates:
                if job.failed:
                    continue
                job.handle.audio_samples = samples
                job.handle._notify()


def _span(plan: WindowPlan, k: int) -> slice:
    return slice(plan.starts[k], plan.starts[k] + plan.length)
