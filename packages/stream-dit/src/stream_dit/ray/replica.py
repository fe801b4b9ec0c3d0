"""A Ray Serve replica: one :class:`~stream_dit.session.StreamSession` with its engine and decoder.

Each replica builds its session from the application's
:class:`~stream_dit.session_spec.SessionSpec` (the code ``stream-dit serve`` runs), warms it up,
and then drives it with an :class:`~stream_dit.aio.AsyncStreamSession`, exactly as the
single-process server does. The ingress sends it requests it has already validated; the replica
answers with host arrays (``numpy``), or a stream of them for streamed audio. Ray Serve's router
never sends it more than its capacity (``max_ongoing_requests`` = slots + queue), so its own queue
is never overrun.

While it lives it reports a snapshot of itself to the application's board (:mod:`.board`), which
``GET /health`` of the ingress lists.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import torch
from ray import serve

from ..aio import AsyncStreamSession
from ..request import Request
from ..server_limits import ServerLimits
from ..session_facts import SessionFacts
from ..session_spec import SessionSpec, build_session, warmup_of
from .board import REPORT_EVERY_S, BoardLink

__all__ = ["StreamReplica"]

_log = logging.getLogger(__name__)


def _host(x: torch.Tensor) -> np.ndarray:
    return x.detach().float().cpu().numpy()


class StreamReplica:
    """One session behind the ingress (a Ray Serve deployment class; see :mod:`stream_dit.ray`).

    Args:
        spec: the session to build (its device is this replica's: ``cuda`` is the GPU Ray gave
            it, as Ray sets ``CUDA_VISIBLE_DEVICES`` per replica).
        limits: overrides of the server limits (:class:`ServerLimits` of the session).
        torch_threads: torch threads of this process (``None``: torch's default).
        app_name: the application's name, which names its health board.
    """

    async def __init__(
        self,
        spec: SessionSpec,
        limits: dict[str, Any],
        torch_threads: int | None,
        app_name: str,
    ) -> None:
        if torch_threads:
            torch.set_num_threads(torch_threads)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.state = "starting"  # -> "warming" -> "ready" | "failed"
        self.in_flight = 0
        self.completed = 0
        self.session = None
        self.driver: AsyncStreamSession | None = None
        self._board = BoardLink(app_name)
        self._reporter = asyncio.get_running_loop().create_task(self._report_forever())
        try:
            # off the event loop: the board keeps hearing from the replica meanwhile
            self.session = await asyncio.to_thread(build_session, spec)
            self.limits = ServerLimits.for_session(self.session, **limits)
            self.facts = SessionFacts.of(self.session)
            self.state = "warming"
            warm = warmup_of(spec)
            if warm is not None:
                await asyncio.to_thread(warm, self.session)
        except BaseException:
            self.state = "failed"
            raise
        self.driver = AsyncStreamSession(self.session, max_pending=max(1, self.limits.capacity))
        self.driver.start()
        self.state = "ready"

    # ------------------------------------------------------------------ what the ingress calls
    async def describe(self) -> tuple[SessionFacts, ServerLimits]:
        """The session's shapes and the server limits the ingress validates against."""
        return self.facts, self.limits

    async def generate(self, request: Request) -> np.ndarray:
        """The finished ``(frames, C)`` latent (``ValueError``/``TypeError`` for a request the
        session refuses, :class:`~stream_dit.aio.RequestFailed` when it fails inside)."""
        with self._counting():
            return _host(await self.driver.generate(request))

    async def generate_audio(self, request: Request) -> np.ndarray:
        """The decoded ``(channels, samples)`` audio."""
        with self._counting():
            return _host(await self.driver.generate_audio(request))

    async def stream_audio(self, request: Request) -> AsyncIterator[np.ndarray]:
        """The decoded audio in pieces as the decoder's windows finish (cancelling the stream
        cancels the request)."""
        with self._counting():
            async for piece in self.driver.stream_audio(request):
                yield _host(piece)

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose driver stopped is replaced."""
        if self.state == "ready" and not self.driver.running:
            raise RuntimeError("the session's driver stopped")

    # ------------------------------------------------------------------ health board
    def snapshot(self) -> dict[str, Any]:
        """What ``GET /health`` shows of this replica."""
        session = self.session
        row: dict[str, Any] = {
            "state": self.state,
            "ready": self.state == "ready",
            "pid": os.getpid(),
            "in_flight": self.in_flight,
            "completed": self.completed,
        }
        if session is not None:
            row.update(
                device=str(session.device),
                active=session.active,
                queued=session.queued + (self.driver.pending if self.driver else 0),
                depth=session.depth,
                capacity=session.depth + session.max_queue,
                ticks=session.ticks,
            )
        return row

    async def _report_forever(self) -> None:
        while True:
            try:
                await self._board.call("report", self.replica, self.snapshot())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # slow or gone: the link waits again or finds a new board
                _log.debug("health report failed: %r", exc)
            await asyncio.sleep(REPORT_EVERY_S)

    @contextlib.contextmanager
    def _counting(self):
        self.in_flight += 1
        try:
            yield
            self.completed += 1
        finally:
            self.in_flight -= 1

    async def __del__(self) -> None:
        # Ray Serve awaits this when it stops the replica (downscaling, redeploying)
        self._reporter.cancel()
        with contextlib.suppress(Exception):
            self._board.forget(self.replica)
        if self.driver is not None:
            await self.driver.stop()
