"""The HTTP server under careless and hostile clients: bounds, caps, full queue, disconnects."""

import json
import socket
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from serve_test_helpers import serving, wait_for  # noqa: E402

from stream_dit import StreamSession, TorchEngine  # noqa: E402
from stream_dit.server import create_app  # noqa: E402
from stream_dit.server_limits import ServerLimits  # noqa: E402

LONG = {"frames": 64, "cond_seed": 0, "cond_len": 4, "steps": 100_000}  # minutes on the tiny model


def _session(model, depth=2, max_queue=2):
    engine = TorchEngine(model, max_batch=8, max_frames=64, max_cond_len=16)
    return StreamSession(model, engine, depth=depth, max_queue=max_queue)


def _post(url, body, **kw):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    with httpx.Client(timeout=30) as client:
        return client.post(
            f"{url}/generate", content=content, headers={"content-type": "application/json"}, **kw
        )


def _health(url):
    return httpx.get(f"{url}/health", timeout=10).json()


def _open_raw(url, body: dict) -> socket.socket:
    """Send a request on a raw socket and leave it waiting (the caller closes it)."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


@pytest.fixture(scope="module")
def server(tiny_model):
    session = _session(tiny_model)
    app = create_app(session, max_steps=100_000, max_curve_len=16, max_body_bytes=64 * 1024)
    with serving(app) as url:
        yield url, session


@pytest.mark.parametrize(
    "body, field",
    [
        ({"frames": 4, "cond_seed": 1, "cond_len": 20_000_000}, "cond_len=20000000"),
        ({"frames": 10**12, "cond_seed": 1}, "frames="),
        ({"frames": 4, "cond_seed": 1, "steps": 10**9}, "steps="),
        ({"frames": 4, "cond_seed": 1, "noise": [0.0] * 17}, "noise length"),
        ({"frames": 4, "cond_seed": 1, "velocity_scale": [1.0] * 17}, "velocity_scale length"),
        ({"frames": 4, "cond_seed": 1, "guidance_curve": [1.0] * 17}, "guidance_curve length"),
        ({"frames": 4, "cond": [[0.0] * 32] * 17}, "cond length (rows)=17"),
        ({"frames": 4, "cond_seed": 1, "negative": [[0.0] * 32] * 17}, "negative length"),
        ({"frames": 4, "cond": [[0.0] * 32, [0.0] * 33]}, "row 1 has 33"),
        ({"frames": 4}, "cond_seed"),
    ],
)
def test_size_fields_are_bounded_before_allocation(server, body, field):
    url, _ = server
    start = time.perf_counter()
    resp = _post(url, body)
    assert resp.status_code == 400, resp.text
    assert field in resp.json()["detail"]
    assert time.perf_counter() - start < 2.0  # refused, not allocated then refused


@pytest.mark.parametrize(
    "raw, field",
    [
        (b"{not json", "not JSON"),
        (b"[" * 20_000 + b"]" * 20_000, "not JSON"),  # nesting past the parser's recursion limit
        (json.dumps({"frames": 4, "cond_seed": 2**64}).encode(), "cond_seed"),
        (json.dumps({"frames": 4, "cond_seed": 1, "seed": -1}).encode(), "seed"),
        (json.dumps({"frames": "many", "cond_seed": 1}).encode(), "frames"),
        (json.dumps({"frames": 4, "cond_seed": 1, "noise": [float("nan")]}).encode(), "noise"),
        (b"[1, 2]", "valid dictionary"),
    ],
)
def test_malformed_bodies_get_422_with_the_field(server, raw, field):
    resp = _post(server[0], raw)
    assert resp.status_code == 422, resp.text
    assert field in resp.text


def test_body_cap_answers_413_with_and_without_content_length(server):
    url, _ = server
    big = json.dumps({"frames": 4, "cond_seed": 1, "pad": "x" * 100_000}).encode()
    assert _post(url, big).status_code == 413

    def chunks():
        for _ in range(100):
            yield b" " * 1024

    start = time.perf_counter()
    with httpx.Client(timeout=30) as client:
        resp = client.post(f"{url}/generate", content=chunks())  # chunked: no content-length
    assert resp.status_code == 413 and "limit" in resp.text
    assert time.perf_counter() - start < 1.5  # the whole body had arrived: nothing to wait for
    ok = _post(url, {"frames": 4, "cond_seed": 1, "cond_len": 3, "steps": 2})
    assert ok.status_code == 200, ok.text


def test_disconnect_cancels_and_frees_the_slot(server):
    url, session = server
    base = _health(url)["counts"].get("disconnected", 0)
    sock = _open_raw(url, LONG)
    assert wait_for(lambda: session.active == 1)
    sock.close()
    assert wait_for(lambda: session.active == 0 and _health(url)["in_flight"] == 0)
    assert _health(url)["counts"]["disconnected"] == base + 1


def test_health_reports_readiness_and_queue_depth(server):
    url, session = server
    h = _health(url)
    assert h["ready"] is True and h["capacity"] == session.depth + session.max_queue
    assert h["limits"]["max_cond_len"] == 16 and h["limits"]["max_body_bytes"] == 64 * 1024
    socks = [_open_raw(url, LONG) for _ in range(3)]
    try:
        assert wait_for(lambda: _health(url)["active"] == 2 and _health(url)["queued"] == 1)
        assert _health(url)["in_flight"] == 3
    finally:
        for s in socks:
            s.close()
    assert wait_for(lambda: _health(url)["in_flight"] == 0 and session.idle)


def test_full_queue_answers_503_with_retry_after(tiny_model):
    session = _session(tiny_model, depth=1, max_queue=1)
    app = create_app(session, max_steps=100_000, retry_after_s=7, max_queue=0)
    with serving(app) as url:
        sock = _open_raw(url, LONG)
        try:
            assert wait_for(lambda: _health(url)["in_flight"] == 1)
            resp = _post(url, {"frames": 4, "cond_seed": 1})
            assert resp.status_code == 503 and resp.headers["retry-after"] == "7"
            assert "capacity is 1" in resp.text
        finally:
            sock.close()
        assert wait_for(lambda: _health(url)["in_flight"] == 0)
        assert _post(url, {"frames": 4, "cond_seed": 1, "steps": 2}).status_code == 200


def _raw_exchange(url, head: bytes, body: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send a whole request on a raw socket and read the answer until the server closes; any
    reset (on send or receive) fails the test."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + body)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    status_line, _, rest = raw.partition(b"\r\n")
    head_text, _, payload = rest.partition(b"\r\n\r\n")
    headers = dict(
        (k.strip().lower(), v.strip())
        for k, _, v in (line.partition(":") for line in head_text.decode().split("\r\n"))
    )
    return int(status_line.split()[1]), headers, payload


def _upload_head(size: int) -> bytes:
    return (
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Connection: close\r\nContent-Length: {size}\r\n\r\n".encode()
    )


def test_oversized_upload_gets_its_413_not_a_reset(server):
    """A client still sending an over-cap body gets the whole 413 (the server discards the rest
    before it closes), whether or not it asked to close."""
    url, _ = server
    body = b" " * (4 << 20)  # 64 times the cap: far more than the socket buffers hold
    status, headers, payload = _raw_exchange(url, _upload_head(len(body)), body)
    assert status == 413 and headers["connection"] == "close"
    assert "limit is 65536" in json.loads(payload)["detail"]
    ok = _post(url, {"frames": 4, "cond_seed": 1, "cond_len": 3, "steps": 2})
    assert ok.status_code == 200, ok.text


FULL_4XX = [
    (b"{not json", 422, "not JSON"),
    (json.dumps({"frames": 4, "cond_seed": 1, "colour": "red"}).encode(), 422, "colour"),
    (b'{"frames": 4, "cond_seed": 1, "guidance": NaN}', 422, "guidance"),
    (json.dumps({"frames": 4, "cond_seed": 1, "steps": "lots"}).encode(), 422, "steps"),
    (json.dumps({"frames": 10**12, "cond_seed": 1}).encode(), 400, "frames="),
    (json.dumps({"frames": 4, "cond": []}).encode(), 400, "at least one token"),
    # finite as JSON, infinite as float32: refused before it can reach a slot
    (json.dumps({"frames": 4, "cond": [[1e39] * 32]}).encode(), 400, "cond must be finite"),
    (json.dumps({"frames": 4, "cond_seed": 1, "denoise": 0.5}).encode(), 400, "init_latent"),
    # finite in float32, but far past any encoder state: it would overflow inside the model
    (json.dumps({"frames": 4, "cond": [[1e30] * 32]}).encode(), 400, "cond values must lie in"),
]


def test_a_full_server_answers_4xx_to_what_can_never_succeed(tiny_model):
    """With every slot and queue place taken, only a valid request is told to retry (503 +
    Retry-After); a malformed one gets its 4xx and an oversized one its 413."""
    session = _session(tiny_model, depth=1, max_queue=1)
    app = create_app(
        session, max_steps=100_000, retry_after_s=7, max_queue=0, max_body_bytes=64 * 1024
    )
    with serving(app) as url:
        sock = _open_raw(url, LONG)
        try:
            assert wait_for(lambda: _health(url)["in_flight"] == 1)
            for raw, code, reason in FULL_4XX:
                resp = _post(url, raw)
                assert resp.status_code == code, (raw[:60], resp.status_code, resp.text)
                assert reason in resp.text and "retry-after" not in resp.headers
            valid = _post(url, {"frames": 4, "cond_seed": 1, "steps": 2})
            assert valid.status_code == 503 and valid.headers["retry-after"] == "7"
            assert "capacity is 1" in valid.text
            big = json.dumps({"frames": 4, "cond_seed": 1, "pad": "x" * 100_000}).encode()
            resp = _post(url, big)
            assert resp.status_code == 413 and "limit is 65536" in resp.json()["detail"]
            status, headers, payload = _raw_exchange(url, _upload_head(1 << 20), b" " * (1 << 20))
            assert headers["connection"] == "close"
            assert status == 413 and "limit is 65536" in json.loads(payload)["detail"]
            counts = _health(url)["counts"]
            assert counts["503"] == 1 and counts["413"] == 2
            assert counts["422"] == 4 and counts["400"] == 5
        finally:
            sock.close()


def test_bodies_in_transit_are_bounded(tiny_model):
    """At most ``max_uploads`` bodies arrive at once (what bounds memory under a flood): a request
    past that waits for a place instead of being shed unread, so a malformed one still gets its
    4xx and a valid one is served; an announced over-cap body is 413 at once."""
    from concurrent.futures import ThreadPoolExecutor

    session = _session(tiny_model, depth=1, max_queue=1)
    app = create_app(session, max_uploads=1, max_body_bytes=64 * 1024, retry_after_s=3)
    with serving(app) as url, ThreadPoolExecutor(2) as pool:
        host, port = url.removeprefix("http://").split(":")
        slow = socket.create_connection((host, int(port)))
        try:
            slow.sendall(_upload_head(100) + b'{"frames": 4,')  # and then nothing
            assert wait_for(lambda: _health(url)["uploading"] == 1)
            bad = pool.submit(_post, url, b'{"frames": 4, "cond_seed": 1, "colour": "red"}')
            good = pool.submit(_post, url, {"frames": 4, "cond_seed": 1, "steps": 2})
            status, _, _ = _raw_exchange(url, _upload_head(1 << 30), b"")
            assert status == 413
            time.sleep(0.5)  # they wait, unread, while the slow body holds the only place
            assert not bad.done() and not good.done() and _health(url)["uploading"] == 1
        finally:
            slow.close()
        resp = bad.result()
        assert resp.status_code == 422 and "colour" in resp.text, resp.text
        assert good.result().status_code == 200
        assert wait_for(lambda: _health(url)["uploading"] == 0)
        assert "503" not in _health(url)["counts"]


def test_request_timeout_answers_504_and_frees_the_slot(tiny_model):
    session = _session(tiny_model, depth=1, max_queue=1)
    with serving(create_app(session, max_steps=100_000, request_timeout_s=0.5)) as url:
        start = time.perf_counter()
        resp = _post(url, LONG)
        assert resp.status_code == 504 and "longer than 0.5 s" in resp.text
        assert time.perf_counter() - start < 5
        assert wait_for(lambda: session.idle)
        assert _health(url)["counts"]["504"] == 1


def test_limits_cannot_exceed_the_engine(tiny_model):
    session = _session(tiny_model)
    with pytest.raises(ValueError, match="max_frames=65 exceeds the engine's limit of 64"):
        ServerLimits.for_session(session, max_frames=65)
    with pytest.raises(ValueError, match="unknown server limits"):
        ServerLimits.for_session(session, max_franes=3)
    with pytest.raises(ValueError, match="max_queue >= 1"):
        create_app(_session(tiny_model, max_queue=0))
    with pytest.raises(ValueError, match="request_timeout_s"):
        ServerLimits.for_session(session, request_timeout_s=0)
    lim = ServerLimits.for_session(session, max_frames=32)
    assert lim.max_frames == 32 and lim.max_cond_len == 16 and lim.capacity == 4
    assert lim.max_uploads == 4  # slots + max_queue
    assert ServerLimits.for_session(session, max_uploads=9).max_uploads == 9
    assert lim.max_body_bytes > 2 * 16 * 32 * 20  # room for cond and negative as JSON


def test_cli_exposes_the_limits(capsys):
    from stream_dit.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for flag in (
        "--max-body-bytes",
        "--max-queue",
        "--request-timeout",
        "--retry-after",
        "--max-steps",
        "--max-curve-len",
        "--max-connections",
        "--max-uploads",
    ):
        assert flag in out
    assert "default 127.0.0.1" in out
