"""Asyncio driver: one background task ticks the session for every caller.

``await driver.generate(request)`` resolves with the finished latent; ``driver.stream(request)`` is
an async iterator over the intermediate latents (one per step, the last one final). With a session
that has a decoder, ``await driver.generate_audio(request)`` resolves with the whole audio and
``driver.stream_audio(request)`` yields it in pieces as the decoder's windows finish. Ticks run in a
worker thread so the event loop stays free for I/O; submissions are handed to the session between
ticks, so the session itself is only touched by one thread at a time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import torch

from .request import Request
from .session import Handle, QueueFullError, Status, StreamSession


class RequestFailed(RuntimeError):
    """The request failed or was cancelled inside the session."""


class AsyncStreamSession:
    """Drive ``session`` from asyncio.

    Args:
        session: the session to tick (used only from the driver's ticking thread once started).
        max_pending: submissions waiting for room in the session's queue before ``generate``
            itself waits (back-pressure toward callers).
    """

    def __init__(self, session: StreamSession, *, max_pending: int = 256) -> None:
        self.session = session
        self._pending: list[tuple] = []
        self._room = asyncio.Semaphore(max_pending)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._lock = threading.Lock()
        self._stopping = False

    async def __aenter__(self) -> AsyncStreamSession:
        self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        """Whether the ticking task is up and not stopping (a server's readiness)."""
        return self._task is not None and not self._task.done() and not self._stopping

    @property
    def pending(self) -> int:
        """Submissions waiting for room in the session's queue."""
        return len(self._pending)

    def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None

    def _validate(self, request: Request) -> None:
        s = self.session
        request.validate(
            channels=s.channels,
            cond_dim=s.cond_dim,
            max_frames=s.engine.max_frames,
            max_cond_len=s.engine.max_cond_len,
            context_channels=s.context_channels,
        )

    async def _enqueue(self, request: Request, on_step=None) -> Handle:
        self._validate(request)  # bad requests fail here, in the caller, before queueing
        if self._task is None:
            raise RuntimeError("the driver is not running; use 'async with' or start()")
        await self._room.acquire()
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.append((request, fut, on_step))
        self._wake.set()
        try:
            return await fut
        except asyncio.CancelledError:
            # admitted just before the caller was cancelled: nobody will cancel that handle
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                fut.result().cancel()
            raise
        finally:
            self._room.release()

    async def generate(self, request: Request) -> torch.Tensor:
        """The finished ``(T, C)`` latent of ``request``.

        Raises:
            ValueError / TypeError: invalid request. RequestFailed: it failed or was cancelled.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def on_step(handle: Handle) -> None:
            if handle.finished and not done.done():
                loop.call_soon_threadsafe(_settle, done, handle)

        handle = await self._enqueue(request, on_step)
        if handle.finished and not done.done():
            _settle(done, handle)
        try:
            return await done
        except asyncio.CancelledError:
            handle.cancel()
            raise

    async def stream(self, request: Request) -> AsyncIterator[torch.Tensor]:
        """Yield the latent after every step; the last item is the finished latent."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        request.stream = True

        def on_step(handle: Handle) -> None:
            if handle.status in (Status.ACTIVE, Status.DONE) and handle.intermediates:
                loop.call_soon_threadsafe(queue.put_nowait, ("step", handle.intermediates[-1]))
            if handle.finished:
                loop.call_soon_threadsafe(queue.put_nowait, ("end", handle))

        handle = await self._enqueue(request, on_step)
        try:
            while True:
                kind, item = await queue.get()
                if kind == "end":
                    if item.status is not Status.DONE:
                        raise RequestFailed(f"request {item.id} {item.status.value}: {item.error}")
                    return
                yield item
        finally:
            if not handle.finished:
                handle.cancel()

    def _audio_session(self, request: Request) -> None:
        if self.session.decoder is None:
            raise ValueError("the session has no decoder: build it with decoder=AudioDecoder(...)")
        if not request.audio:
            raise ValueError("request.audio is False: its latent would not be decoded")

    async def generate_audio(self, request: Request) -> torch.Tensor:
        """The decoded ``(channels, samples)`` float32 audio of ``request`` (on the host).

        Raises:
            ValueError / TypeError: invalid request, or a session without a decoder.
            RequestFailed: denoising or decoding failed, or the request was cancelled.
        """
        chunks = [chunk async for chunk in self.stream_audio(request)]
        if len(chunks) == 1:
            return chunks[0]
        return torch.cat(chunks, dim=-1)

    async def stream_audio(self, request: Request) -> AsyncIterator[torch.Tensor]:
        """Yield ``request``'s audio in order, ``(channels, n)`` float32 host tensors, as soon as
        the decoder has made each piece final (the pieces end on window seams)."""
        self._audio_session(request)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def on_step(handle: Handle) -> None:
            if handle.audio_samples or handle.audio_error is not None or handle.finished:
                loop.call_soon_threadsafe(queue.put_nowait, handle)

        handle = await self._enqueue(request, on_step)
        sent = 0
        try:
            while True:
                h = await queue.get()
                if h.status in (Status.FAILED, Status.CANCELLED):
                    raise RequestFailed(f"request {h.id} {h.status.value}: {h.error}")
                if h.audio_error is not None:
                    raise RequestFailed(f"request {h.id}: decoding failed: {h.audio_error}")
                ready = h.audio_samples
                if h.audio is not None and ready > sent:
                    # a copy: the buffer stays the session's, pinned
                    yield h.audio[:, sent:ready].clone()
                    sent = ready
                if h.audio_done and sent == h.audio.shape[-1]:
                    return
        finally:
            if not handle.audio_done:
                handle.cancel()

    def _admit_pending(self) -> None:
        keep = []
        for request, fut, on_step in self._pending:
            if fut.done():
                continue
            try:
                handle = self.session.submit(request)
            except QueueFullError:
                keep.append((request, fut, on_step))
                continue
            except Exception as exc:
                fut.set_exception(exc)
                continue
            if on_step is not None:
                handle.add_listener(on_step)
            fut.set_result(handle)
        self._pending = keep

    async def _run(self) -> None:
        while True:
            self._admit_pending()
            if self.session.idle and not self._pending:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                await asyncio.to_thread(self.session.tick)
            except Exception as exc:  # never let one bad tick strand every waiting caller
                self.session.fail_active(exc)


def _settle(fut: asyncio.Future, handle: Handle) -> None:
    if fut.done():
        return
    if handle.status is Status.DONE:
        fut.set_result(handle.result)
    else:
        fut.set_exception(
            RequestFailed(f"request {handle.id} {handle.status.value}: {handle.error}")
        )
