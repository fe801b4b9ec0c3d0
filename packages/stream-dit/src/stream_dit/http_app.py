"""The HTTP API of stream-dit, in front of any :class:`Backend` that denoises requests.

:func:`create_http_app` holds the routes, the admission order and every answer of
:mod:`stream_dit.server` (whose module doc describes the API): read the body under its cap,
validate it (4xx), check readiness and capacity (503 + ``Retry-After``), then hand the request to
the backend and answer with ``.npy`` latents, a WAV or a streamed WAV. The single-process server's
backend drives a session in this process; the Ray Serve ingress's backend routes each request to
a replica (:mod:`stream_dit.ray.routing`). Both answer the same input the same way because both
go through this module and :mod:`stream_dit.http_intake`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import torch
from fastapi import FastAPI
from fastapi.requests import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect

from .aio import RequestFailed
from .http_intake import (
    Reject,
    audio_options,
    check_query,
    declared_length,
    npy_bytes,
    parse_request,
    read_body,
    refuse_nonfinite,
    rejection_response,
)
from .request import Request
from .server_limits import ServerLimits
from .session_facts import SessionFacts
from .wav import peak_normalize, wav_bytes, wav_header, wav_samples

__all__ = ["Backend", "create_http_app"]

_log = logging.getLogger(__name__)


class Backend(Protocol):
    """What serves the validated requests of an HTTP app.

    The request methods raise ``ValueError``/``TypeError`` for a request the backend refuses
    (400), :class:`~stream_dit.aio.RequestFailed` when it failed inside (500), and
    :class:`~stream_dit.http_intake.Reject` for any other answer (503 when it is full, ...).
    Cancelling a call cancels its request.
    """

    facts: SessionFacts

    def lifespan(self) -> AbstractAsyncContextManager[None]:
        """Entered when the app starts, left when it stops."""
        ...

    def state(self) -> str:
        """``"starting"``, ``"warming"``, ``"ready"``, ``"failed"`` or ``"stopping"``."""
        ...

    def failure(self) -> str | None:
        """Why the state is ``"failed"`` (``None`` otherwise)."""
        ...

    @property
    def capacity(self) -> int:
        """Valid requests in flight before new ones are answered 503."""
        ...

    async def health(self) -> dict[str, Any]:
        """The backend's own fields of ``GET /health`` (occupancy, queue depth, replicas, ...)."""
        ...

    async def generate(self, request: Request) -> torch.Tensor:
        """The finished ``(frames, C)`` latent."""
        ...

    async def generate_audio(self, request: Request) -> torch.Tensor:
        """The decoded ``(channels, samples)`` audio."""
        ...

    def stream_audio(self, request: Request) -> AsyncIterator[torch.Tensor]:
        """The decoded audio in pieces, in order; ``aclose()`` cancels the request."""
        ...


async def _until_disconnect(request: HTTPRequest) -> None:
    # once the body is read, the next ASGI message is the disconnect (or the response's end)
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _Gone(Exception):
    """The client hung up while its request was being served."""


def create_http_app(
    backend: Backend, limits: ServerLimits, *, title: str = "stream-dit"
) -> FastAPI:
    """A FastAPI app answering ``/generate``, ``/generate/audio``, ``/generate/audio/stream`` and
    ``/health`` for ``backend``, bounded by ``limits`` (see :mod:`stream_dit.server`)."""
    counts: Counter[str] = Counter()
    in_flight = 0  # parsed, valid requests handed to the backend
    uploading = 0  # bodies being received
    facts = backend.facts

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        async with backend.lifespan():
            yield

    app = FastAPI(title=title, lifespan=lifespan)
    app.state.limits = limits
    app.state.counts = counts
    app.state.backend = backend

    # at most max_uploads bodies are held while they arrive (the memory of a flood stays
    # bounded); a request past that waits for a place rather than being shed, since deciding
    # whether it is even valid needs its body, and a malformed one must hear so, not "retry"
    places: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}

    def upload_places() -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()  # one per serving loop (a test may start several)
        if loop not in places:
            places.clear()
            places[loop] = asyncio.Semaphore(limits.max_uploads)
        return places[loop]

    async def read_request(http: HTTPRequest, deadline: float) -> Request:
        nonlocal uploading
        declared = declared_length(http, limits.max_body_bytes)
        upload = upload_places()
        try:
            await asyncio.wait_for(upload.acquire(), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise Reject(504, "no upload place came free within the request timeout") from None
        uploading += 1
        try:
            raw = await asyncio.wait_for(
                read_body(http, limits.max_body_bytes, declared),
                max(0.0, deadline - time.monotonic()),
            )
        except asyncio.TimeoutError:
            raise Reject(504, "the body did not arrive within the request timeout") from None
        finally:
            uploading -= 1
            upload.release()
        return parse_request(raw, limits, facts)

    async def until_done(http: HTTPRequest, aw: Awaitable[Any], deadline: float) -> Any:
        """``await aw``, cancelled (and its request with it) when the client disconnects or the
        deadline passes; the backend's refusals become 4xx/5xx answers."""
        work = asyncio.ensure_future(aw)
        watch = asyncio.ensure_future(_until_disconnect(http))
        try:
            await asyncio.wait(
                {work, watch},
                timeout=max(0.0, deadline - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()  # the backend cancels the request (a session frees its slot)
                await asyncio.gather(work, return_exceptions=True)
        if work.cancelled():
            if watch.done() and not watch.cancelled():
                raise _Gone()
            raise Reject(504, f"the request took longer than {limits.request_timeout_s} s")
        try:
            return work.result()
        except (ValueError, TypeError) as exc:
            raise Reject(400, str(exc)) from None
        except RequestFailed as exc:
            raise Reject(500, str(exc)) from None

    async def serve_latent(http: HTTPRequest, request: Request, deadline: float) -> Response:
        request.audio = False  # nobody will listen: do not spend the decoder on it
        latent = await until_done(http, backend.generate(request), deadline)
        refuse_nonfinite(latent, "latent")
        counts["completed"] += 1
        return Response(content=npy_bytes(latent), media_type="application/octet-stream")

    async def serve_audio(
        http: HTTPRequest, request: Request, deadline: float, fmt: str, normalize: bool
    ) -> Response:
        request.audio = True
        audio = await until_done(http, backend.generate_audio(request), deadline)
        refuse_nonfinite(audio, "audio")
        if normalize:
            audio = peak_normalize(audio)
        counts["completed"] += 1
        return Response(
            content=wav_bytes(audio, facts.audio.sample_rate, fmt), media_type="audio/wav"
        )

    async def stream_audio(
        http: HTTPRequest, request: Request, deadline: float, fmt: str, release: Callable[[], None]
    ) -> Response:
        """A WAV whose header is sent with the first decoded piece and whose samples follow as
        the decoder's windows finish. The status is decided by the first piece; a failure after
        it ends the body early (a short file)."""
        request.audio = True
        pieces = backend.stream_audio(request)
        first = await until_done(http, pieces.__anext__(), deadline)
        try:
            refuse_nonfinite(first, "audio")
        except Reject:
            await pieces.aclose()
            raise
        audio = facts.audio
        header = wav_header(
            request.frames * audio.hop, audio.audio_channels, audio.sample_rate, fmt
        )

        async def body() -> AsyncIterator[bytes]:
            try:
                yield header + wav_samples(first, fmt)
                while True:
                    left = deadline - time.monotonic()
                    try:
                        piece = await asyncio.wait_for(pieces.__anext__(), max(0.0, left))
                    except StopAsyncIteration:
                        counts["completed"] += 1
                        return
                    except (asyncio.TimeoutError, RequestFailed) as exc:
                        counts["stream_cut"] += 1
                        _log.warning("audio stream ended early: %r", exc)
                        return
                    if not bool(torch.isfinite(piece).all()):
                        # the status is sent already: end the file short rather than send NaN
                        counts["stream_cut"] += 1
                        _log.warning("audio stream ended early: non-finite samples")
                        return
                    yield wav_samples(piece, fmt)
            finally:
                await pieces.aclose()
                release()

        # the background task runs after the body, and also when the body never started (the
        # client left before the headers went out); release() runs once either way
        return StreamingResponse(body(), media_type="audio/wav", background=BackgroundTask(release))

    async def admit(
        http: HTTPRequest, respond: Callable[..., Awaitable[Response]], *args: Any
    ) -> Response:
        """Read, validate and admit one request, then ``respond(http, request, deadline,
        *args)``; every refusal is answered here with its status and reason."""
        nonlocal in_flight
        deadline = time.monotonic() + limits.request_timeout_s
        try:
            # 4xx first: a request that can never succeed must not be told to retry
            request = await read_request(http, deadline)
            now = backend.state()
            if now == "failed":
                raise Reject(503, backend.failure())
            if now != "ready":
                raise Reject(503, f"the server is not ready ({now})", {"Retry-After": "1"})
            capacity = backend.capacity
            if in_flight >= capacity:
                raise Reject(
                    503,
                    f"{in_flight} requests in flight, the server's capacity is {capacity}",
                    {"Retry-After": str(limits.retry_after_s)},
                )
            in_flight += 1
            released = handed_over = False

            def release() -> None:
                nonlocal in_flight, released
                if not released:
                    released = True
                    in_flight -= 1

            try:
                if respond is stream_audio:
                    response = await stream_audio(http, request, deadline, *args, release)
                    handed_over = True  # the body's end releases the place
                    return response
                return await respond(http, request, deadline, *args)
            finally:
                if not handed_over:
                    release()
        except Reject as rej:
            counts[str(rej.status)] += 1
            return rejection_response(rej, http)
        except (ClientDisconnect, _Gone):
            counts["disconnected"] += 1
            return Response(status_code=499)  # nobody is listening; for the access log

    @app.post("/generate")
    async def generate(http: HTTPRequest) -> Response:
        try:
            check_query(http.query_params, frozenset())
        except Reject as rej:
            counts[str(rej.status)] += 1
            return JSONResponse({"detail": rej.detail}, rej.status)
        return await admit(http, serve_latent)

    async def audio_route(http: HTTPRequest, *, stream: bool) -> Response:
        try:
            fmt, normalize = audio_options(http.query_params, facts, stream=stream)
        except Reject as rej:
            counts[str(rej.status)] += 1
            return JSONResponse({"detail": rej.detail}, rej.status)
        if stream:
            return await admit(http, stream_audio, fmt)
        return await admit(http, serve_audio, fmt, normalize)

    @app.post("/generate/audio")
    async def generate_audio(http: HTTPRequest) -> Response:
        return await audio_route(http, stream=False)

    @app.post("/generate/audio/stream")
    async def generate_audio_stream(http: HTTPRequest) -> Response:
        return await audio_route(http, stream=True)

    @app.get("/health")
    async def health() -> JSONResponse:
        now = backend.state()
        ready = now == "ready"
        body = {
            "ready": ready,
            "state": now,
            **(await backend.health()),
            "in_flight": in_flight,
            "uploading": uploading,
            "capacity": backend.capacity,
            "counts": dict(counts),
            "limits": limits.as_dict(),
        }
        failure = backend.failure()
        if failure is not None:
            body["error"] = failure
        return JSONResponse(body, status_code=200 if ready else 503)

    return app
