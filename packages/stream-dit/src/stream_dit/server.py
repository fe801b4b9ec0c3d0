"""HTTP front of a session (``stream-dit serve``): JSON in, ``.npy`` latents or WAV audio out.

Needs the ``serve`` extra (FastAPI and uvicorn). ``POST /generate`` takes a JSON request and answers
with the finished ``(frames, channels)`` float32 latent as the bytes of a ``.npy`` file. With a
session that has a decoder, the same body sent to

* ``POST /generate/audio`` is answered with the decoded audio as a WAV file (query
  ``format=pcm16`` (16-bit PCM clipped to [-1, 1], the default: what ``wave``, browsers and audio
  tools open) or ``f32`` (IEEE float), ``normalize=true``
  to scale the clip's peak to -1 dBFS as ACE-Step's pipeline does);
* ``POST /generate/audio/stream`` is answered with a WAV whose samples arrive in chunks as the
  decoder's windows finish (``format`` as above; the header states the final length, so the
  stream is a complete file once it ends; the status is decided by the first piece, and a
  failure after it ends the body early).

Without a decoder those two answer 404; a query parameter a route does not take (``/generate``
takes none) or a bad value of one is 422. Every answer other than 200
carries the reason:

* 413: the body is larger than ``max_body_bytes`` (from ``Content-Length`` before anything is
  read, or counted while a chunked body streams in), answered with ``Connection: close``;
* 422: not JSON, unknown fields, non-finite numbers, wrong types;
* 400: a size field beyond :class:`~stream_dit.server_limits.ServerLimits` (checked before any
  tensor is allocated) or a request the engine refuses (:meth:`Request.validate`);
* 503 + ``Retry-After``: ``slots + max_queue`` requests are already in flight, or the server is
  starting, warming its engine up or stopping (503 without ``Retry-After`` once the warm-up has
  failed);
* 504: the request took longer than ``request_timeout_s`` (it is cancelled, its slot freed);
* 500: the request failed inside the session, or its latent or audio came out with NaN or inf
  values (never sent as a 200).

The order matters to clients that retry on 503: a request is read (capped at ``max_body_bytes``)
and validated first, so one that can never succeed gets its 4xx even while the server is full, and
only a valid request is answered 503. Memory stays bounded without checking capacity first: at
most ``max_uploads`` bodies of at most ``max_body_bytes`` are held while they arrive (a request
past that waits for a place, within its timeout, rather than being shed unread), one is parsed at
a time (on the event loop), and at most ``slots + max_queue`` parsed requests are in flight.

A 413 is sent at once and closes the connection, but only after the server has read and
discarded what the client is still sending (for up to 10 s, 2 s at most between pieces, like
nginx's lingering close): closing a socket with unread bytes in it resets the connection, and a
client that is still uploading would then see the reset instead of the answer. A client that
announced more than 1 GiB (or asked for ``100-continue``) is answered and closed at once.

A client that disconnects cancels its request: its slot is freed at the next tick. ``GET /health``
reports readiness (503 while not ready) and its ``state`` (``"starting"``, ``"warming"``,
``"ready"``, ``"failed"``, ``"stopping"``), occupancy, queue depth, counters and the limits.

When the app starts, the engine is warmed up (:func:`stream_dit.warmup.warmup`, or the callable
given as ``warmup``) on a thread of its own, so ``/health`` answers meanwhile; the server reports
ready and admits requests only once the warm-up has finished.

The routes live in :mod:`stream_dit.http_app` and the body rules in :mod:`stream_dit.http_intake`,
shared with the Ray Serve front (:mod:`stream_dit.ray`), which answers the same way in front of
many sessions.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import torch
from fastapi import FastAPI

from .aio import AsyncStreamSession
from .http_app import create_http_app
from .http_intake import GenerateBody, npy_bytes, to_request
from .request import Request
from .server_limits import ServerLimits
from .session import StreamSession
from .session_facts import SessionFacts

__all__ = [
    "GenerateBody",
    "ServerLimits",
    "SessionBackend",
    "create_app",
    "npy_bytes",
    "to_request",
]

_log = logging.getLogger(__name__)


class _Warmup:
    """The engine's warm-up, run once on a thread of its own when the app starts."""

    def __init__(self, fn: Callable[[StreamSession], Any] | None) -> None:
        self.fn = fn
        self.state = "pending" if fn is not None else "done"  # -> "warming" -> "done" | "failed"
        self.report: Any = None
        self.error: BaseException | None = None

    def start(self, session: StreamSession) -> None:
        if self.state != "pending":
            return
        self.state = "warming"
        threading.Thread(
            target=self._run, args=(session,), name="stream-dit-warmup", daemon=True
        ).start()

    def _run(self, session: StreamSession) -> None:
        try:
            report = self.fn(session)
        except BaseException as exc:  # the server stays unready and says why
            _log.exception("the engine's warm-up failed")
            self.error = exc
            self.state = "failed"
        else:
            self.report = report
            self.state = "done"


def _default_warmup(session: StreamSession) -> Any:
    from .warmup import warmup

    return warmup(session)


def _warmup_of(warmup: bool | Callable[[StreamSession], Any] | None) -> _Warmup:
    if warmup is True:
        return _Warmup(_default_warmup)
    if warmup is False or warmup is None:
        return _Warmup(None)
    if callable(warmup):
        return _Warmup(warmup)
    raise TypeError(f"warmup must be a bool or a callable, got {type(warmup).__name__}")


class SessionBackend:
    """Serves requests from a session in this process (the backend of :func:`create_app`).

    An :class:`~stream_dit.aio.AsyncStreamSession` ticks the session while the app runs; the
    warm-up runs on a thread of its own when the app starts, and the backend is ready once it has
    finished.
    """

    def __init__(
        self,
        session: StreamSession,
        limits: ServerLimits,
        warmup: bool | Callable[[StreamSession], Any] | None = True,
    ) -> None:
        self.session = session
        self.limits = limits
        self.facts = SessionFacts.of(session)
        self.driver = AsyncStreamSession(session, max_pending=max(1, limits.capacity))
        self.warm = _warmup_of(warmup)
        self._phase = "starting"  # -> "serving" -> "stopping"

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """Tick the session while the app runs; start the warm-up."""
        async with self.driver:
            # the driver idles until a request is admitted, and none is before the warm-up ends
            self.warm.start(self.session)
            self._phase = "serving"
            try:
                yield
            finally:
                self._phase = "stopping"

    def state(self) -> str:
        if self._phase == "starting":
            return "starting"
        if self._phase == "stopping" or not self.driver.running:
            return "stopping"
        if self.warm.state == "failed":
            return "failed"
        if self.warm.state != "done":
            return "warming"
        return "ready"

    def failure(self) -> str | None:
        if self.warm.error is None:
            return None
        return f"the engine's warm-up failed: {self.warm.error!r}"

    @property
    def capacity(self) -> int:
        return self.limits.capacity

    async def health(self) -> dict[str, Any]:
        session = self.session
        return {
            "warmup": None if self.warm.report is None else str(self.warm.report),
            "active": session.active,
            "queued": session.queued + self.driver.pending,
            "depth": session.depth,
            "ticks": session.ticks,
        }

    async def generate(self, request: Request) -> torch.Tensor:
        return await self.driver.generate(request)

    async def generate_audio(self, request: Request) -> torch.Tensor:
        return await self.driver.generate_audio(request)

    def stream_audio(self, request: Request) -> AsyncIterator[torch.Tensor]:
        return self.driver.stream_audio(request)


def create_app(
    session: StreamSession,
    limits: ServerLimits | None = None,
    *,
    warmup: bool | Callable[[StreamSession], Any] = True,
    **limit_overrides: Any,
) -> FastAPI:
    """A FastAPI app serving ``session``; the driver starts and stops with the app's lifespan.

    Args:
        session: the session to serve; its engine's limits bound every request.
        limits: the server's bounds (default: :meth:`ServerLimits.for_session` with
            ``limit_overrides``, e.g. ``max_body_bytes=1 << 20``, ``request_timeout_s=30``).
        warmup: warm the engine up when the app starts, before it reports ready: ``True`` runs
            :func:`stream_dit.warmup.warmup` on the session with its defaults, a callable is
            called with the session instead (its return value, e.g. the report, is shown by
            ``/health`` as ``"warmup"``), ``False`` reports ready as soon as the driver runs.
            It runs on a thread of its own; while it runs, ``/health`` answers 503 with
            ``"state": "warming"`` and ``POST /generate`` answers 503 with ``Retry-After``.
    """
    if session.max_queue < 1:
        raise ValueError(
            "the session needs max_queue >= 1: requests enter a slot through its queue"
        )
    if limits is None:
        limits = ServerLimits.for_session(session, **limit_overrides)
    elif limit_overrides:
        raise TypeError("give limits or limit overrides, not both")
    backend = SessionBackend(session, limits, warmup)
    app = create_http_app(backend, limits)
    app.state.warmup = backend.warm
    return app
