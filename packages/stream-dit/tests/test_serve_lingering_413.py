"""A 413 reaches clients that are still uploading a body far over the cap (lingering close)."""

import json
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serve_test_helpers import serving

from stream_dit import StreamSession, TorchEngine
from stream_dit.http_intake import LINGER_MAX_BYTES
from stream_dit.server import create_app

CAP = 64 * 1024


@pytest.fixture(scope="module")
def url(tiny_model):
    engine = TorchEngine(tiny_model, max_batch=4, max_frames=16, max_cond_len=8)
    session = StreamSession(tiny_model, engine, depth=2, max_queue=2)
    with serving(create_app(session, warmup=False, max_body_bytes=CAP)) as base:
        yield base


def _upload(url: str, size: int, *, send: int | None = None, chunked: bool = False):
    """Send the whole body (or ``send`` bytes of it) before reading anything, as most clients
    do, then read until the server closes; a reset on the way fails with the error's name."""
    host, port = url.removeprefix("http://").split(":")
    piece = b" " * (1 << 20)
    try:
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            length = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
            sock.sendall(
                f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"{length}\r\n\r\n".encode()
            )
            left = size if send is None else send
            while left > 0:
                n = min(left, len(piece))
                sock.sendall(f"{n:x}\r\n".encode() + piece[:n] + b"\r\n" if chunked else piece[:n])
                left -= n
            if chunked:
                sock.sendall(b"0\r\n\r\n")
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
    except OSError as exc:
        return type(exc).__name__, None
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), payload


def test_many_clients_sending_64_mb_each_get_their_413(url):
    results = []

    def client(chunked: bool) -> None:
        results.append(_upload(url, 64 << 20, chunked=chunked))

    threads = [threading.Thread(target=client, args=(i % 4 == 3,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [status for status, _ in results] == [413] * 8, results
    for _, payload in results:
        assert f"limit of {CAP}" in payload.decode() or f"limit is {CAP}" in payload.decode()


def test_a_body_too_large_to_wait_for_is_answered_at_once(url):
    """Announced past the linger budget: the 413 goes out and the connection closes without
    waiting for the body (the client sends a little and reads)."""
    start = time.perf_counter()
    status, payload = _upload(url, 2 * LINGER_MAX_BYTES, send=16)
    assert status == 413 and json.loads(payload)["detail"].endswith(f"limit is {CAP}")
    assert time.perf_counter() - start < 2.0
