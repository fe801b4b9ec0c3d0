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

Without a decoder those two answer 404; a bad query parameter is 422. Every answer other than 200
carries the reason:

* 413: the body is larger than ``max_body_bytes`` (from ``Content-Length`` before anything is
  read, or counted while a chunked body streams in), answered with ``Connection: close``;
* 422: not JSON, unknown fields, non-finite numbers, wrong types;
* 400: a size field beyond :class:`~stream_dit.server_limits.ServerLimits` (checked before any
  tensor is allocated) or a request the engine refuses (:meth:`Request.validate`);
* 503 + ``Retry-After``: ``slots + max_queue`` requests are already in flight, or the server is
  starting, warming its engine up or stopping (503 without ``Retry-After`` once the warm-up has
  failed); also when ``max_uploads`` bodies are being received already (before this one is read);
* 504: the request took longer than ``request_timeout_s`` (it is cancelled, its slot freed);
* 500: the request failed inside the session, or its latent or audio came out with NaN or inf
  values (never sent as a 200).

The order matters to clients that retry on 503: a request is read (capped at ``max_body_bytes``)
and validated first, so one that can never succeed gets its 4xx even while the server is full, and
only a valid request is answered 503. Memory stays bounded without checking capacity first: at
most ``max_uploads`` bodies of at most ``max_body_bytes`` are held while they arrive, one is parsed
at a time (on the event loop), and at most ``slots + max_queue`` parsed requests are in flight.

A 413 closes the connection, and before answering, the server reads and discards what the client
is still sending (up to four times ``max_body_bytes``, at least 16 MiB, for at most 2 s): closing
a socket with unread bytes in it resets the connection, and a client that is still uploading would
then see the reset instead of the answer. A client that announced more than that (or asked for
``100-continue``) is answered at once.

A client that disconnects cancels its request: its slot is freed at the next tick. ``GET /health``
reports readiness (503 while not ready) and its ``state`` (``"starting"``, ``"warming"``,
``"ready"``, ``"failed"``, ``"stopping"``), occupancy, queue depth, counters and the limits.

When the app starts, the engine is warmed up (:func:`stream_dit.warmup.warmup`, or the callable
given as ``warmup``) on a thread of its own, so ``/health`` answers meanwhile; the server reports
ready and admits requests only once the warm-up has finished.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import numpy as np
import torch
from fastapi import FastAPI
from fastapi.requests import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect

from .aio import AsyncStreamSession, RequestFailed
from .request import SEED_MAX, Request
from .server_limits import ServerLimits
from .session import StreamSession
from .wav import WAV_FORMATS, peak_normalize, wav_bytes, wav_header, wav_samples

__all__ = ["GenerateBody", "ServerLimits", "create_app", "npy_bytes", "to_request"]

_log = logging.getLogger(__name__)


class GenerateBody(BaseModel):
    """The JSON body of ``POST /generate`` (sizes are bounded by :class:`ServerLimits`)."""

    # strict: a bool is not an int and a string not a number (422); ints are numbers
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    frames: int = Field(ge=1)
    cond: list[list[float]] | None = None
    cond_seed: int | None = Field(
        default=None,
        ge=0,
        le=SEED_MAX,
        description="draw (cond_len, D) states from this seed instead of sending them",
    )
    cond_len: int = Field(default=8, ge=0)
    negative: list[list[float]] | None = None
    seed: int = Field(default=0, ge=0, le=SEED_MAX)
    steps: int = Field(default=8, ge=1)
    shift: float = 1.0
    denoise: float = 1.0
    guidance: float = 1.0
    cfg_type: Literal["none", "full", "self", "initialize"] = "none"
    guidance_mode: Literal["cfg", "apg"] = "cfg"
    cfg_rescale: float = 0.0
    velocity_scale: list[float] | None = None
    noise: list[float] | None = None
    guidance_curve: list[float] | None = None
    dcw: list[float] | None = Field(default=None, min_length=2, max_length=2)


def to_request(body: GenerateBody, limits: ServerLimits) -> Request:
    """The session request of ``body``, after :meth:`ServerLimits.check` (400 reasons as ValueError)."""
    limits.check(body)
    if body.cond is not None:
        cond = _states(body.cond, "cond", limits.cond_dim)
    else:
        gen = torch.Generator().manual_seed(body.cond_seed)
        cond = torch.randn(body.cond_len, limits.cond_dim, generator=gen)
    neg = _states(body.negative, "negative", limits.cond_dim) if body.negative is not None else None
    fields = body.model_dump(exclude={"cond", "cond_seed", "cond_len", "negative"})
    return Request(cond=cond, negative=neg, **fields)


def _states(rows: list[list[float]], name: str, cond_dim: int) -> torch.Tensor:
    # rows were checked rectangular by ServerLimits.check; an empty list is (0, D)
    return torch.tensor(rows, dtype=torch.float32).reshape(len(rows), cond_dim)


def npy_bytes(x: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x.detach().float().cpu().numpy())
    return buf.getvalue()


class _Reject(Exception):
    def __init__(self, status: int, detail: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers


class _TooLarge(_Reject):
    """413: the body is over the cap; ``read`` bytes of it arrived (all of it when ``ended``),
    ``declared`` were announced."""

    def __init__(
        self, detail: str, *, read: int, declared: int | None, ended: bool = False
    ) -> None:
        super().__init__(413, detail, {"Connection": "close"})
        self.read, self.declared, self.ended = read, declared, ended


#: After a 413, what the server reads and discards of a body still arriving (see the module's doc).
_DRAIN_MIN_BYTES = 16 << 20
_DRAIN_BODY_CAPS = 4
_DRAIN_S = 2.0


def _refuse_nonfinite(x: torch.Tensor, what: str) -> None:
    """The last guard before an answer: a result with NaN or inf is a failure (500 with the
    reason), never a 200 (the request checks keep numbers in ranges where this cannot happen)."""
    bad = int(torch.count_nonzero(~torch.isfinite(x)))
    if bad:
        raise _Reject(500, f"the request produced a {what} with {bad} NaN or infinite values; "
                           "nothing is returned")  # fmt: skip


def _validation_reasons(exc: ValidationError) -> list[dict[str, str]]:
    # never echo the input back: it may be huge, and NaN/inf do not encode as JSON
    return [
        {"field": ".".join(str(p) for p in err.get("loc", ())), "reason": err.get("msg", "")}
        for err in exc.errors(include_input=False)
    ]


def _declared_length(request: HTTPRequest, cap: int) -> int | None:
    """The announced body size (``None`` for a chunked upload); 413 beyond ``cap``, read nothing."""
    declared = request.headers.get("content-length")
    if declared is None:
        return None
    if not declared.isdigit():
        raise _Reject(400, f"content-length must be a byte count, got {declared!r}")
    size = int(declared)
    if size > cap:
        raise _TooLarge(
            f"the body has {size} bytes; the server's limit is {cap}", read=0, declared=size
        )
    return size


async def _read_body(request: HTTPRequest, cap: int, declared: int | None) -> bytes:
    """The whole body, or 413 as soon as more than ``cap`` bytes arrived (at most ``cap`` plus one
    chunk is ever held)."""
    chunks, size = [], 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        more = message.get("more_body", False)
        size += len(chunk)
        if size > cap:  # chunked uploads carry no content-length: count as they arrive
            raise _TooLarge(
                f"the body exceeds the server's limit of {cap} bytes",
                read=size,
                declared=declared,
                ended=not more,
            )
        chunks.append(chunk)
        if not more:
            return b"".join(chunks)


async def _drain(request: HTTPRequest, too_large: _TooLarge, cap: int, deadline: float) -> None:
    """Read and discard what is left of an over-cap body, within a budget, so that the 413 and the
    close that follows it reach a client that is still sending instead of resetting its connection.
    Returns at once when the rest cannot fit the budget or the client waits for ``100-continue``."""
    if too_large.ended:
        return
    budget = max(_DRAIN_BODY_CAPS * cap, _DRAIN_MIN_BYTES)
    if too_large.declared is not None and too_large.declared - too_large.read > budget:
        return  # it cannot end within the budget: answer now
    if too_large.read == 0 and "100-continue" in request.headers.get("expect", "").lower():
        return  # the client sends nothing before it is told to continue
    until = min(deadline, time.monotonic() + _DRAIN_S)
    while budget > 0:
        left = until - time.monotonic()
        if left <= 0:
            return
        try:
            message = await asyncio.wait_for(request.receive(), left)
        except asyncio.TimeoutError:
            return
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return
        budget -= len(message.get("body", b""))


def _parse(raw: bytes, limits: ServerLimits, session: StreamSession) -> Request:
    """The validated session request of a body: 422 for what is not a well-formed request, 400
    for one beyond the limits or one the session would refuse at submit."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise _Reject(422, [{"field": "", "reason": f"the body is not JSON: {exc}"}]) from None
    try:
        body = GenerateBody.model_validate(obj)
    except ValidationError as exc:
        raise _Reject(422, _validation_reasons(exc)) from None
    try:
        request = to_request(body, limits)
        # what submit() would refuse (an empty cond, a number that overflows float32, ...) is
        # refused now, before the server's capacity is looked at
        request.validate(
            channels=session.channels,
            cond_dim=session.cond_dim,
            max_frames=session.engine.max_frames,
            max_cond_len=session.engine.max_cond_len,
            context_channels=session.context_channels,
        )
    except (ValueError, TypeError) as exc:
        raise _Reject(400, str(exc)) from None
    return request


async def _until_disconnect(request: HTTPRequest) -> None:
    # once the body is read, the next ASGI message is the disconnect (or the response's end)
    while (await request.receive())["type"] != "http.disconnect":
        pass


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
    driver = AsyncStreamSession(session, max_pending=max(1, limits.capacity))
    counts: Counter[str] = Counter()
    in_flight = 0  # parsed, valid requests queued or denoising
    uploading = 0  # bodies being received
    if warmup is True:
        warm = _Warmup(_default_warmup)
    elif warmup is False or warmup is None:
        warm = _Warmup(None)
    elif callable(warmup):
        warm = _Warmup(warmup)
    else:
        raise TypeError(f"warmup must be a bool or a callable, got {type(warmup).__name__}")
    phase = "starting"  # -> "serving" -> "stopping"

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        nonlocal phase
        async with driver:
            # the driver idles until a request is admitted, and none is before the warm-up ends
            warm.start(session)
            phase = "serving"
            try:
                yield
            finally:
                phase = "stopping"

    def state() -> str:
        if phase == "starting":
            return "starting"
        if phase == "stopping" or not driver.running:
            return "stopping"
        if warm.state == "failed":
            return "failed"
        if warm.state != "done":
            return "warming"
        return "ready"

    app = FastAPI(title="stream-dit", lifespan=lifespan)
    app.state.limits = limits
    app.state.counts = counts
    app.state.warmup = warm

    async def read_request(http: HTTPRequest, deadline: float) -> Request:
        nonlocal uploading
        declared = _declared_length(http, limits.max_body_bytes)
        if uploading >= limits.max_uploads:
            # deciding anything else needs the body; holding more bodies at once would not keep
            # the memory of a flood bounded
            raise _Reject(
                503,
                f"{uploading} request bodies are being received, the server's limit is "
                f"{limits.max_uploads}",
                {"Retry-After": str(limits.retry_after_s)},
            )
        uploading += 1
        try:
            raw = await asyncio.wait_for(
                _read_body(http, limits.max_body_bytes, declared),
                max(0.0, deadline - time.monotonic()),
            )
        except asyncio.TimeoutError:
            raise _Reject(504, "the body did not arrive within the request timeout") from None
        finally:
            uploading -= 1
        return _parse(raw, limits, session)

    class _Gone(Exception):
        """The client hung up while its request was being served."""

    async def until_done(http: HTTPRequest, aw: Awaitable[Any], deadline: float) -> Any:
        """``await aw``, cancelled (and its request with it) when the client disconnects or the
        deadline passes; the session's refusals become 4xx/5xx answers."""
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
                work.cancel()  # the driver cancels the handle: its slot frees at the next tick
                await asyncio.gather(work, return_exceptions=True)
        if work.cancelled():
            if watch.done() and not watch.cancelled():
                raise _Gone()
            raise _Reject(504, f"the request took longer than {limits.request_timeout_s} s")
        try:
            return work.result()
        except (ValueError, TypeError) as exc:
            raise _Reject(400, str(exc)) from None
        except RequestFailed as exc:
            raise _Reject(500, str(exc)) from None

    async def serve_latent(http: HTTPRequest, request: Request, deadline: float) -> Response:
        request.audio = False  # nobody will listen: do not spend the decoder on it
        latent = await until_done(http, driver.generate(request), deadline)
        _refuse_nonfinite(latent, "latent")
        counts["completed"] += 1
        return Response(content=npy_bytes(latent), media_type="application/octet-stream")

    def audio_options(http: HTTPRequest, *, stream: bool) -> tuple[str, bool]:
        """(format, normalize) from the query string; 404 without a decoder, 422 for bad ones."""
        if session.decoder is None:
            raise _Reject(404, "this server has no audio decoder (stream-dit serve --vae ...)")
        query = http.query_params
        unknown = sorted(set(query) - ({"format"} if stream else {"format", "normalize"}))
        if unknown:
            raise _Reject(422, [{"field": k, "reason": "unknown query parameter"} for k in unknown])
        fmt = query.get("format", "pcm16")
        if fmt not in WAV_FORMATS:
            raise _Reject(422, [{"field": "format", "reason": f"must be one of {WAV_FORMATS}"}])
        flag = query.get("normalize", "false").lower()
        if flag not in ("true", "false", "1", "0"):
            raise _Reject(422, [{"field": "normalize", "reason": "must be true or false"}])
        return fmt, flag in ("true", "1")

    async def serve_audio(
        http: HTTPRequest, request: Request, deadline: float, fmt: str, normalize: bool
    ) -> Response:
        request.audio = True
        audio = await until_done(http, driver.generate_audio(request), deadline)
        _refuse_nonfinite(audio, "audio")
        if normalize:
            audio = peak_normalize(audio)
        counts["completed"] += 1
        decoder = session.decoder
        return Response(content=wav_bytes(audio, decoder.sample_rate, fmt), media_type="audio/wav")

    async def stream_audio(
        http: HTTPRequest, request: Request, deadline: float, fmt: str, release: Callable[[], None]
    ) -> Response:
        """A WAV whose header is sent with the first decoded piece and whose samples follow as
        the decoder's windows finish. The status is decided by the first piece; a failure after
        it ends the body early (a short file)."""
        request.audio = True
        pieces = driver.stream_audio(request)
        first = await until_done(http, pieces.__anext__(), deadline)
        try:
            _refuse_nonfinite(first, "audio")
        except _Reject:
            await pieces.aclose()
            raise
        decoder = session.decoder
        header = wav_header(
            request.frames * decoder.hop, decoder.audio_channels, decoder.sample_rate, fmt
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
            now = state()
            if now == "failed":
                raise _Reject(503, f"the engine's warm-up failed: {warm.error!r}")
            if now != "ready":
                raise _Reject(503, f"the server is not ready ({now})", {"Retry-After": "1"})
            if in_flight >= limits.capacity:
                raise _Reject(
                    503,
                    f"{in_flight} requests in flight, the server's capacity is {limits.capacity}",
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
        except _Reject as rej:
            if isinstance(rej, _TooLarge):
                await _drain(http, rej, limits.max_body_bytes, deadline)
            counts[str(rej.status)] += 1
            return JSONResponse({"detail": rej.detail}, rej.status, headers=rej.headers)
        except (ClientDisconnect, _Gone):
            counts["disconnected"] += 1
            return Response(status_code=499)  # nobody is listening; for the access log

    @app.post("/generate")
    async def generate(http: HTTPRequest) -> Response:
        return await admit(http, serve_latent)

    async def audio_route(http: HTTPRequest, *, stream: bool) -> Response:
        try:
            fmt, normalize = audio_options(http, stream=stream)
        except _Reject as rej:
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
        now = state()
        ready = now == "ready"
        body = {
            "ready": ready,
            "state": now,
            "warmup": None if warm.report is None else str(warm.report),
            "active": session.active,
            "queued": session.queued + driver.pending,
            "in_flight": in_flight,
            "uploading": uploading,
            "capacity": limits.capacity,
            "depth": session.depth,
            "ticks": session.ticks,
            "counts": dict(counts),
            "limits": limits.as_dict(),
        }
        if warm.error is not None:
            body["error"] = f"the engine's warm-up failed: {warm.error!r}"
        return JSONResponse(body, status_code=200 if ready else 503)

    return app
