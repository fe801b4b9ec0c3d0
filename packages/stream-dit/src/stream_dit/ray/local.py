"""``stream-dit serve --ray``: start (or join) Ray, deploy the application, serve until stopped."""

from __future__ import annotations

import os
import signal
import threading

import ray
from ray import serve

from .app import build_app
from .options import RayServeOptions

__all__ = ["deploy", "serve_until_stopped", "start_ray"]


def start_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join the Ray cluster at ``address``, or start Ray on this machine with ``num_cpus``
    (default: all its cores), without the dashboard. The workspace is importable where Ray's
    workers start, so no runtime environment is packaged."""
    if ray.is_initialized():
        return
    if address is not None:
        ray.init(address=address, log_to_driver=False)
        return
    # address="local": a Ray of its own, even where another process of this machine runs one
    # (a bare ray.init() would join that cluster and share, or replace, its Serve apps)
    ray.init(
        address="local",
        num_cpus=num_cpus or os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
    )


def deploy(options: RayServeOptions, *, host: str = "127.0.0.1", port: int = 8000) -> str:
    """Start Serve's HTTP proxy on ``host:port`` and deploy the application of ``options``;
    returns its base URL once every replica is up."""
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(options), name=options.app_name, route_prefix="/")
    return f"http://{host}:{port}"


def serve_until_stopped(
    options: RayServeOptions,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    address: str | None = None,
    num_cpus: int | None = None,
) -> None:
    """Deploy, then wait for SIGINT or SIGTERM; then delete the application (and shut down a
    Ray started here)."""
    start_ray(address, num_cpus)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        url = deploy(options, host=host, port=port)
        print(f"stream-dit on Ray Serve at {url}", flush=True)
        stop.wait()
        serve.delete(options.app_name)
    finally:
        if address is None:  # the Ray started here goes with it
            serve.shutdown()
            ray.shutdown()
