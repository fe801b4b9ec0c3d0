"""The ingress's backend: each validated request goes to a replica that Ray Serve's router picks.

:class:`ReplicaRouter` is the :class:`~stream_dit.http_app.Backend` of the ingress. It calls the
replicas' deployment handle (Ray Serve's router chooses the replica: power of two choices on
queue length, never past a replica's ``max_ongoing_requests``) and turns what can go wrong on the
way into the answers of the HTTP API:

* every ready replica's queue full and ``max_queued`` requests already waiting for one: 503 with
  ``Retry-After`` (the :attr:`ReplicaRouter.capacity` the HTTP app checks; a ``BackPressureError``
  of Ray Serve, where a deployment config sets ``max_queued_requests``, is answered the same);
* the replica died (its process was killed, its node was lost): the request is sent once more,
  to another replica, when nothing of it was streamed yet: the request carries its seed, so the
  answer is the one the first replica would have given; when the second one dies too, 503 with
  ``Retry-After`` (Ray Serve restarts dead replicas). A stream that had started ends early, like
  any stream that fails after its first piece;
* a request the replica refused (``ValueError``/``TypeError``) or one that failed inside it
  (:class:`~stream_dit.aio.RequestFailed`) keeps its type, so it is answered 400 or 500 with the
  replica's reason, exactly as the single-process server would answer it.

Cancelling a call (the client left, the deadline passed) cancels the request on its replica.
It also reads the replicas' health board (:mod:`.board`) for ``GET /health`` and readiness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import torch
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError
from ray.serve.exceptions import BackPressureError

from ..aio import RequestFailed
from ..http_intake import Reject
from ..request import Request
from ..server_limits import ServerLimits
from ..session_facts import SessionFacts
from .board import REPORT_EVERY_S, BoardLink
from .options import RayServeOptions

__all__ = ["ReplicaRouter"]

_log = logging.getLogger(__name__)


def _tensor(x: np.ndarray) -> torch.Tensor:
    # arrays from Ray's object store are read-only views; torch wants memory it may write
    return torch.from_numpy(x if x.flags.writeable else x.copy())


def _replica_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says the replica's process is gone (not that the request failed)."""
    if isinstance(exc, RayTaskError):
        exc = exc.cause
    return isinstance(exc, (RayActorError, ActorUnavailableError))


def _as_answer(exc: BaseException) -> BaseException:
    """What the HTTP app answers for a call that raised ``exc`` (the replica is alive)."""
    cause = exc.cause if isinstance(exc, RayTaskError) else exc
    # the replica's own refusals, without Ray's traceback around their message
    for kind in (ValueError, TypeError, RequestFailed):
        if isinstance(cause, kind):
            return kind(str(cause))
    return RequestFailed(f"the replica failed: {cause!r}")


class ReplicaRouter:
    """Serves validated requests through the replicas' deployment handle.

    Args:
        handle: the ``StreamReplica`` deployment's handle.
        facts, limits: what a replica described of its session (every replica builds the same).
        options: the application's options (capacity, app name for the board).
    """

    def __init__(
        self,
        handle: Any,
        facts: SessionFacts,
        limits: ServerLimits,
        options: RayServeOptions,
    ) -> None:
        self.handle = handle
        self.stream_handle = handle.options(stream=True)
        self.facts = facts
        self.limits = limits
        self.options = options
        self.counts: Counter[str] = Counter()
        self._rows: list[dict[str, Any]] = []
        self._phase = "starting"  # -> "serving" -> "stopping"

    # ------------------------------------------------------------------ Backend: state
    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        watcher = asyncio.get_running_loop().create_task(self._watch_board())
        self._phase = "serving"
        try:
            yield
        finally:
            self._phase = "stopping"
            watcher.cancel()

    def state(self) -> str:
        """Ready while a replica is (or when the board has no word yet: Ray Serve's router only
        routes to running replicas); ``"starting"`` when every replica stopped answering."""
        if self._phase != "serving":
            return self._phase
        fresh = [r for r in self._rows if r["fresh"]]
        if not self._rows or any(r["ready"] for r in fresh):
            return "ready"
        return "warming" if fresh else "starting"

    def failure(self) -> str | None:
        return None  # a replica that fails to start is retried by Ray Serve

    @property
    def capacity(self) -> int:
        """Requests in flight before the ingress answers 503: every ready replica's slots and
        queue (``max_ongoing_requests``) and ``max_queued`` more waiting for one of them.

        The bound is counted here rather than left to Ray Serve's ``max_queued_requests``, which
        counts every request still being routed as queued and so turns a burst away while
        replicas have room. Before the board has word of any replica, the most replicas that
        can run are assumed."""
        fresh_ready = sum(1 for r in self._rows if r["fresh"] and r["ready"])
        replicas = fresh_ready if self._rows else self.options.most_replicas
        return replicas * self.options.replica_capacity + self.max_queued

    @property
    def max_queued(self) -> int:
        return self.options.max_queued or self.options.replica_capacity

    async def health(self) -> dict[str, Any]:
        fresh = [r for r in self._rows if r["fresh"]]

        def total(key: str) -> int:
            return sum(int(r.get(key) or 0) for r in fresh)

        return {
            "replicas": self._rows,
            "replicas_ready": sum(1 for r in fresh if r["ready"]),
            "active": total("active"),
            "queued": total("queued"),
            "depth": total("depth"),
            "ticks": total("ticks"),
            "routing": dict(self.counts),
        }

    async def _watch_board(self) -> None:
        board = BoardLink(self.options.app_name)
        while True:
            try:
                self._rows = await board.call("rows")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # slow or gone: the link waits again or finds a new board
                _log.debug("health board unreachable: %r", exc)
            await asyncio.sleep(REPORT_EVERY_S)

    # ------------------------------------------------------------------ Backend: requests
    async def generate(self, request: Request) -> torch.Tensor:
        return _tensor(await self._call("generate", request))

    async def generate_audio(self, request: Request) -> torch.Tensor:
        return _tensor(await self._call("generate_audio", request))

    async def _call(self, method: str, request: Request) -> Any:
        for attempt in range(2):
            response = getattr(self.handle, method).remote(request)
            try:
                return await response
            except asyncio.CancelledError:
                response.cancel()
                raise
            except Exception as exc:
                self._retry_or_raise(exc, attempt)
        raise AssertionError("unreachable")

    async def stream_audio(self, request: Request) -> AsyncIterator[torch.Tensor]:
        """The replica's pieces; sent again to another replica when its replica died before the
        first piece, cut short (:class:`RequestFailed`) when it died after."""
        for attempt in range(2):
            pieces = self.stream_handle.stream_audio.remote(request)
            sent = False
            try:
                async for piece in pieces:
                    sent = True
                    yield _tensor(piece)
                return
            except (asyncio.CancelledError, GeneratorExit):
                pieces.cancel()
                raise
            except Exception as exc:
                if sent:
                    self.counts["streams_cut"] += 1
                    raise RequestFailed(
                        f"the stream's replica failed after it had started: {_as_answer(exc)}"
                    ) from None
                self._retry_or_raise(exc, attempt)
        raise AssertionError("unreachable")

    def _retry_or_raise(self, exc: Exception, attempt: int) -> None:
        """Return to send the request again; raise what the HTTP app answers otherwise."""
        retry_after = {"Retry-After": str(self.limits.retry_after_s)}
        if isinstance(exc, BackPressureError):
            self.counts["backpressure"] += 1
            raise Reject(
                503,
                "every replica's queue is full and as many requests as Ray Serve's "
                "max_queued_requests allows are waiting for one",
                retry_after,
            ) from None
        if _replica_gone(exc):
            self.counts["replica_died"] += 1
            if attempt == 0:
                _log.warning("a replica died while serving a request; sending it to another")
                self.counts["retried"] += 1
                return
            raise Reject(
                503,
                "the replica serving this request died, and so did the one it was sent to "
                "next; Ray Serve restarts dead replicas",
                retry_after,
            ) from None
        raise _as_answer(exc) from None
