"""The ingress of the Ray Serve application: the HTTP API of ``stream-dit serve``, in front of
the replicas.

Ray Serve's HTTP proxy hands every request to this deployment, which answers it with
:func:`stream_dit.http_app.create_http_app` (the single-process server's routes and rules: the
body cap and its 413, 422/400 validation, 503 + ``Retry-After`` when full, 504, cancellation on
disconnect), backed by a :class:`~stream_dit.ray.routing.ReplicaRouter` that sends each valid
request to a replica. It holds no model: the shapes it validates against come from a replica
when it starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import torch
from ray import serve

from ..http_app import create_http_app
from ..server_limits import ServerLimits
from ..session_facts import SessionFacts
from .options import RayServeOptions
from .routing import ReplicaRouter

__all__ = ["StreamIngress"]

_log = logging.getLogger(__name__)


async def _describe(handle: Any) -> tuple[SessionFacts, ServerLimits]:
    """A replica's session facts and limits, asked until one answers (replicas may still be
    starting, or die while starting)."""
    delay = 0.2
    while True:
        try:
            return await handle.describe.remote()
        except Exception as exc:
            _log.warning("no replica could describe its session yet: %r", exc)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 5.0)


@serve.ingress()
class StreamIngress:
    """The HTTP front (a Ray Serve deployment class with its ASGI app; see :mod:`stream_dit.ray`).

    Args:
        replicas: the handle of the ``StreamReplica`` deployment.
        options: the application's options.
    """

    async def __init__(self, replicas: Any, options: RayServeOptions) -> None:
        torch.set_num_threads(1)  # it parses and draws cond_seed states, nothing heavier
        facts, limits = await _describe(replicas)
        self.router = ReplicaRouter(replicas, facts, limits, options)
        if options.limits.get("max_uploads") is None:
            # one replica's default would throttle uploads to the whole deployment: as many
            # bodies may arrive at once as requests may be in flight
            self.router.limits = dataclasses.replace(
                limits,
                max_uploads=options.most_replicas * options.replica_capacity
                + self.router.max_queued,
            )

    def __serve_build_asgi_app__(self) -> Any:
        return create_http_app(self.router, self.router.limits, title="stream-dit (Ray Serve)")
