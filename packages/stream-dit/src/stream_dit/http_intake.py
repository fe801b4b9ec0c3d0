"""Reading and validating one HTTP request body, for every front that serves a session.

The single-process server (:mod:`stream_dit.server`) and the Ray Serve ingress
(:mod:`stream_dit.ray`) both answer through :func:`stream_dit.http_app.create_http_app`, which
reads bodies with these functions, so the two give the same 4xx/413 answers for the same input:

* :func:`declared_length` refuses an announced body over the cap before anything is read;
* :func:`read_body` counts a body (chunked ones too) as it arrives and stops at the cap;
* :func:`parse_request` turns the bytes into a validated :class:`~stream_dit.request.Request`
  (422 for what is not a well-formed request, 400 for one beyond the limits or the model's shapes);
* :func:`rejection_response` answers a :class:`Reject`; a 413 is sent at once and then the rest of
  the body still arriving is read and discarded (see :class:`LingeringResponse`) before the
  connection closes.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from typing import Any, Literal

import numpy as np
import torch
from fastapi.requests import Request as HTTPRequest
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from .request import SEED_MAX, Request
from .server_limits import ServerLimits
from .session_facts import SessionFacts
from .wav import WAV_FORMATS

__all__ = [
    "GenerateBody",
    "LingeringResponse",
    "Reject",
    "TooLarge",
    "audio_options",
    "check_query",
    "declared_length",
    "npy_bytes",
    "parse_request",
    "read_body",
    "refuse_nonfinite",
    "rejection_response",
    "to_request",
]


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
    apg_momentum: float = -0.5
    apg_norm_threshold: float = 0.0
    apg_eta: float = 0.0
    init_latent: list[list[float]] | None = Field(
        default=None, description="(frames, C) latent to start from; needed when denoise < 1"
    )
    velocity_scale: list[float] | None = None
    noise: list[float] | None = None
    guidance_curve: list[float] | None = None
    dcw: list[float] | None = Field(default=None, min_length=2, max_length=2)


def to_request(body: GenerateBody, limits: ServerLimits) -> Request:
    """The session request of ``body``, after :meth:`ServerLimits.check` (400 reasons as ValueError).

    ``cond_seed`` states are drawn here, on the host, from the seed alone: the same body gives the
    same request in every process that parses it.
    """
    limits.check(body)
    if body.cond is not None:
        cond = _states(body.cond, limits.cond_dim)
    else:
        gen = torch.Generator().manual_seed(body.cond_seed)
        cond = torch.randn(body.cond_len, limits.cond_dim, generator=gen)
    neg = _states(body.negative, limits.cond_dim) if body.negative is not None else None
    init = None
    if body.init_latent is not None:  # rows checked rectangular by ServerLimits.check
        init = torch.tensor(body.init_latent, dtype=torch.float32)
        init = init.reshape(len(body.init_latent), -1 if body.init_latent else 0)
    fields = body.model_dump(exclude={"cond", "cond_seed", "cond_len", "negative", "init_latent"})
    return Request(cond=cond, negative=neg, init_latent=init, **fields)


def _states(rows: list[list[float]], cond_dim: int) -> torch.Tensor:
    # rows were checked rectangular by ServerLimits.check; an empty list is (0, D)
    return torch.tensor(rows, dtype=torch.float32).reshape(len(rows), cond_dim)


def npy_bytes(x: torch.Tensor | np.ndarray) -> bytes:
    """``x`` as the bytes of a float32 ``.npy`` file."""
    buf = io.BytesIO()
    if isinstance(x, torch.Tensor):
        x = x.detach().float().cpu().numpy()
    np.save(buf, np.asarray(x, dtype=np.float32))
    return buf.getvalue()


class Reject(Exception):
    """An answer other than 200: ``status``, the JSON ``detail`` and extra headers."""

    def __init__(self, status: int, detail: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers


class TooLarge(Reject):
    """413: the body is over the cap; ``read`` bytes of it arrived (all of it when ``ended``),
    ``declared`` were announced."""

    def __init__(
        self, detail: str, *, read: int, declared: int | None, ended: bool = False
    ) -> None:
        super().__init__(413, detail, {"Connection": "close"})
        self.read, self.declared, self.ended = read, declared, ended
        self.expects_continue = False  # the client asked for "100 Continue" before sending


#: After a 413 has been sent, how much of a body still arriving the server reads and discards
#: before it closes (nginx's lingering close: a socket closed with unread bytes in it resets the
#: connection, and a client still uploading then sees the reset instead of the answer). Time
#: bounds it (what it costs is a connection and the copying, never memory); a body announced
#: larger than the byte budget is not waited for.
LINGER_S = 10.0
LINGER_IDLE_S = 2.0
LINGER_MAX_BYTES = 1 << 30
#: A body announced past the budget is not waited for, but what is already on its way is still
#: read (briefly) before the close, so that those bytes do not turn the close into a reset.
BRIEF_LINGER_S = 1.0
BRIEF_LINGER_IDLE_S = 0.2


def refuse_nonfinite(x: torch.Tensor, what: str) -> None:
    """The last guard before an answer: a result with NaN or inf is a failure (500 with the
    reason), never a 200 (the request checks keep numbers in ranges where this cannot happen)."""
    bad = int(torch.count_nonzero(~torch.isfinite(x)))
    if bad:
        raise Reject(
            500,
            f"the request's {what} came out with {bad} NaN or infinite values; nothing is "
            "returned",
        )


def _validation_reasons(exc: ValidationError) -> list[dict[str, str]]:
    # never echo the input back: it may be huge, and NaN/inf do not encode as JSON
    return [
        {"field": ".".join(str(p) for p in err.get("loc", ())), "reason": err.get("msg", "")}
        for err in exc.errors(include_input=False)
    ]


def declared_length(request: HTTPRequest, cap: int) -> int | None:
    """The announced body size (``None`` for a chunked upload); 413 beyond ``cap``, read nothing."""
    declared = request.headers.get("content-length")
    if declared is None:
        return None
    if not declared.isdigit():
        raise Reject(400, f"content-length must be a byte count, got {declared!r}")
    size = int(declared)
    if size > cap:
        raise TooLarge(
            f"the body has {size} bytes; the server's limit is {cap}", read=0, declared=size
        )
    return size


async def read_body(request: HTTPRequest, cap: int, declared: int | None) -> bytes:
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
            raise TooLarge(
                f"the body exceeds the server's limit of {cap} bytes",
                read=size,
                declared=declared,
                ended=not more,
            )
        chunks.append(chunk)
        if not more:
            return b"".join(chunks)


def parse_request(raw: bytes, limits: ServerLimits, facts: SessionFacts) -> Request:
    """The validated session request of a body: 422 for what is not a well-formed request, 400
    for one beyond the limits or one the session would refuse at submit."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise Reject(422, [{"field": "", "reason": f"the body is not JSON: {exc}"}]) from None
    try:
        body = GenerateBody.model_validate(obj)
    except ValidationError as exc:
        raise Reject(422, _validation_reasons(exc)) from None
    try:
        request = to_request(body, limits)
        # what submit() would refuse (an empty cond, a number that overflows float32, ...) is
        # refused now, before the server's capacity is looked at
        request.validate(**facts.validation_shapes())
    except (ValueError, TypeError) as exc:
        raise Reject(400, str(exc)) from None
    return request


def check_query(query: Any, known: frozenset[str] | set[str]) -> None:
    """422 naming every query parameter of a route that it does not take (one rule for every
    route: a misspelt option must not be ignored)."""
    unknown = sorted(set(query) - set(known))
    if unknown:
        takes = ", ".join(sorted(known)) if known else "none"
        raise Reject(
            422,
            [{"field": k, "reason": f"unknown query parameter (this route takes {takes})"}
             for k in unknown],
        )  # fmt: skip


def audio_options(query: Any, facts: SessionFacts, *, stream: bool) -> tuple[str, bool]:
    """(format, normalize) from an audio route's query string; 404 without a decoder, 422 for
    unknown or bad parameters."""
    if facts.audio is None:
        raise Reject(404, "this server has no audio decoder (stream-dit serve --vae ...)")
    check_query(query, {"format"} if stream else {"format", "normalize"})
    fmt = query.get("format", "pcm16")
    if fmt not in WAV_FORMATS:
        raise Reject(422, [{"field": "format", "reason": f"must be one of {WAV_FORMATS}"}])
    flag = query.get("normalize", "false").lower()
    if flag not in ("true", "false", "1", "0"):
        raise Reject(422, [{"field": "normalize", "reason": "must be true or false"}])
    return fmt, flag in ("true", "1")


class LingeringResponse(JSONResponse):
    """A 413 that reaches a client still uploading: the whole answer is sent at once, then what
    is left of the body is read and discarded (within :data:`LINGER_S`, at most
    :data:`LINGER_IDLE_S` between pieces), and only then does the response end and the connection
    close. A client that reads while it sends sees the answer early; one that reads only after
    sending gets it from its socket buffer once it has sent everything."""

    def __init__(self, rej: TooLarge) -> None:
        super().__init__({"detail": rej.detail}, rej.status, headers=rej.headers)
        self.linger = _linger_bounds(rej)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        lingers = self.linger is not None
        await send({"type": "http.response.body", "body": self.body, "more_body": lingers})
        if lingers:
            await _discard_rest(receive, *self.linger)
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def _linger_bounds(rej: TooLarge) -> tuple[float, float] | None:
    """``(total, idle)`` seconds of reading the rest of the body after the 413, or ``None`` when
    there is nothing to read."""
    if rej.ended:
        return None
    if rej.declared is not None and rej.declared - rej.read > LINGER_MAX_BYTES:
        return BRIEF_LINGER_S, BRIEF_LINGER_IDLE_S  # it cannot end within the budget
    # a client that waits for "100 Continue" sends nothing unless asked (and asking is what
    # reading would do): it has the answer and nothing to discard
    if rej.read == 0 and rej.expects_continue:
        return None
    return LINGER_S, LINGER_IDLE_S


async def _discard_rest(receive: Receive, total_s: float, idle_s: float) -> None:
    until = time.monotonic() + total_s
    budget = LINGER_MAX_BYTES
    while budget > 0:
        left = min(until - time.monotonic(), idle_s)
        if left <= 0:
            return
        try:
            message = await asyncio.wait_for(receive(), left)
        except asyncio.TimeoutError:
            return
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        budget -= len(message.get("body", b""))


def rejection_response(rej: Reject, http: HTTPRequest) -> JSONResponse:
    """The answer to ``rej``: JSON ``{"detail": ...}`` with its status and headers (a 413 lingers,
    see :class:`LingeringResponse`)."""
    if isinstance(rej, TooLarge):
        rej.expects_continue = "100-continue" in http.headers.get("expect", "").lower()
        return LingeringResponse(rej)
    return JSONResponse({"detail": rej.detail}, rej.status, headers=rej.headers)
