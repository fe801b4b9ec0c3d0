"""Run an app on a free loopback port in a background thread (for the server tests)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import httpx
import uvicorn

from stream_dit.serve_load import free_port


@contextmanager
def serving(app, *, ready: bool = True, **config):
    """Serve ``app`` on loopback; with ``ready``, wait until ``/health`` reports ready (the engine's
    warm-up has finished) before yielding the base URL."""
    port = free_port()
    srv = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config)
    )
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    if ready and not wait_for(
        lambda: httpx.get(f"{url}/health", timeout=10).status_code == 200, timeout=60
    ):
        srv.should_exit = True
        thread.join(timeout=30)
        raise RuntimeError("server did not report ready")
    try:
        yield url
    finally:
        srv.should_exit = True
        thread.join(timeout=30)


def wait_for(predicate, timeout: float = 10.0, every: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return predicate()
