"""stream-dit on Ray Serve, for real on CPU: Ray started here, the tiny model, two replicas.

One Ray and one deployment serve the whole module (starting them is most of its time). The main
test sends 100 mixed clients (valid latents and streamed audio, malformed, oversized, cut) while
one replica is killed, and checks that every valid request is served with the single-process
server's output, every bad one gets its 4xx, nobody hangs, and Ray Serve restarts the replica.
"""

import asyncio
import io
import json
import os
import signal
import struct
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
ray = pytest.importorskip("ray")

import numpy as np  # noqa: E402
from ray import serve  # noqa: E402
from serve_test_helpers import serving, wait_for  # noqa: E402

from stream_dit.ray import RayServeOptions, build_app  # noqa: E402
from stream_dit.ray.app import replica_deployment_options  # noqa: E402
from stream_dit.serve_load import extreme_requests, free_port, malformed_requests  # noqa: E402
from stream_dit.server import create_app  # noqa: E402
from stream_dit.session_spec import SessionSpec, build_session  # noqa: E402

SPEC = SessionSpec(preset="tiny", depth=2, max_queue=4, max_frames=32, max_cond_len=16)
#: The servers' own request timeout (a 504) bounds a hang, not the load: on a busy 2-core machine a
#: request queued behind a killed replica and its slow replacement took over 120 s, while answers
#: kept flowing. Hangs are caught by STALL_S (no answer for that long), not by this.
LIMITS = {"max_body_bytes": 64 * 1024, "max_steps": 100_000, "request_timeout_s": 1200.0}
APP = "stream-dit-test"
STEPS = 24  # long enough that the kill lands while requests are in flight


def _options(**kw) -> RayServeOptions:
    return RayServeOptions(
        spec=SPEC, limits=LIMITS, replicas=2, health_check_period_s=1.0, app_name=APP, **kw
    )


#: Serve kills a proxy that has not answered its readiness check in 5 s, three times over: on a
#: loaded two-core machine its start (imports, the HTTP server) takes longer. The actors inherit
#: these from the driver's environment when ray.init starts the local cluster.
SLOW_MACHINE_ENV = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "120",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "120",
}


def _proxy_answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/-/healthz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _start_serve(port: int) -> None:
    """``serve.start``, waiting for the HTTP proxy as long as it takes to come up: Ray gives it a
    fixed 60 s and raises ``TimeoutError`` (its controller running) when a busy machine starts it
    later. Starting again connects to that controller; the proxy is then awaited by its route."""
    options = {"host": "127.0.0.1", "port": port}
    try:
        serve.start(http_options=options)
    except TimeoutError:
        serve.start(http_options=options)
        assert wait_for(lambda: _proxy_answers(port), timeout=READY_S), "the HTTP proxy never came up"


@pytest.fixture(scope="module")
def ray_url():
    for name, value in SLOW_MACHINE_ENV.items():
        os.environ.setdefault(name, value)
    # a cluster of this process's own, never one another process of the machine started
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="warning",
    )
    try:
        port = free_port()
        _start_serve(port)
        serve.run(build_app(_options()), name=APP, route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: _health(url).get("replicas_ready") == 2, timeout=READY_S), _health(url)
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def single_url():
    """The single-process server of the same spec: the outputs the replicas must give."""
    app = create_app(build_session(SPEC), warmup=False, **LIMITS)
    with serving(app) as url:
        yield url


def _health(url: str) -> dict:
    try:
        return httpx.get(f"{url}/health", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return {}


def _bodies() -> list[dict]:
    bodies = []
    for i in range(6):
        body = {
            "frames": (16, 32)[i % 2],
            "cond_seed": i,
            "cond_len": 6,
            "seed": 100 + i,
            "steps": STEPS,
            "shift": 3.0,
        }
        if i % 3 == 2:
            body.update(cfg_type="full", guidance=3.0)
        bodies.append(body)
    return bodies


# ---------------------------------------------------------------------------- raw HTTP clients
async def _exchange(url: str, path: str, body: bytes, *, declared=None, send=None, hang_up=None):
    """One request on its own connection: (status, headers, payload), or None when we hung up on
    purpose. The whole body is sent before the answer is read, as most clients do."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\n"
            f"Content-Length: {len(body) if declared is None else declared}\r\n\r\n"
        )
        writer.write(head.encode() + (body if send is None else body[:send]))
        await writer.drain()
        if hang_up is not None:
            await asyncio.sleep(hang_up)
            return None
        raw = await reader.read()
    finally:
        writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        payload = _dechunk(payload)
    return int(lines[0].split()[1]), headers, payload


def _dechunk(data: bytes) -> bytes:
    out, i = b"", 0
    while True:
        end = data.find(b"\r\n", i)
        if end < 0:
            return out  # cut short
        size = int(data[i:end].split(b";")[0], 16)
        if size == 0:
            return out
        out += data[end + 2 : end + 2 + size]
        i = end + 2 + size + 2


#: A client load fails as hung when no request has been answered (other than 503) for this long.
#: It bounds a hang, not the load: a slow machine may take as long as it needs while answers flow.
STALL_S = 180.0
#: Waits on a state (replicas ready, slots freed) return as soon as it holds; this only bounds a
#: state that never comes.
READY_S = 300.0


class Progress:
    """When a request last got a real answer (not a 503): the load's sign of life."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def answered(self) -> None:
        self.last = time.monotonic()

    def stalled(self) -> bool:
        return time.monotonic() - self.last > STALL_S


async def _until_not_503(url, path, raw, progress: Progress, **opts):
    """POST until the answer is not 503 (honouring Retry-After); the caller's watchdog ends a
    load in which nothing is answered any more."""
    while True:
        status, headers, payload = await _exchange(url, path, raw, **opts)
        if status != 503:
            progress.answered()
            return status, headers, payload
        await asyncio.sleep(float(headers.get("retry-after", "1")))


async def _gather_while_answered(tasks, progress: Progress) -> None:
    """Wait for every task; fail (naming how many are left) once answers stop for STALL_S."""
    pending = set(tasks)
    while pending:
        _, pending = await asyncio.wait(pending, timeout=1.0)
        if pending and progress.stalled():
            for task in pending:
                task.cancel()
            raise AssertionError(f"{len(pending)} clients unanswered for {STALL_S:.0f} s: a hang")
    for task in tasks:
        task.result()  # a client's own failure


def _wav_lengths(payload: bytes) -> tuple[int, int]:
    """(data bytes the header announces, data bytes present)."""
    assert payload[:4] == b"RIFF" and payload[8:12] == b"WAVE", payload[:16]
    announced = struct.unpack("<I", payload[40:44])[0]
    return announced, len(payload) - 44


# ---------------------------------------------------------------------------- the tests
#: The suite's 600 s hang guard covers the fixtures too. Beside other CPU-heavy work on 2 cores,
#: starting the cluster and its replicas took 7 min and replacing the killed one 3 more; each
#: wait here is on readiness (READY_S apiece), so the guard only has to outlast them.
@pytest.mark.timeout(1800)
def test_one_ray_serve_app_under_load_and_full(ray_url, single_url):
    """Both scenarios on one Ray (one test, so that pytest-xdist cannot put them in two workers:
    two Ray clusters on one 2-core machine at once never both get their replicas up)."""
    _100_mixed_clients_and_a_killed_replica(ray_url, single_url)
    _full_replicas_answer_503_with_retry_after(ray_url)


def _100_mixed_clients_and_a_killed_replica(ray_url, single_url):
    bodies = _bodies()
    reference = []
    for body in bodies:
        resp = httpx.post(f"{single_url}/generate", json=body, timeout=STALL_S)
        assert resp.status_code == 200, resp.text
        reference.append(np.load(io.BytesIO(resp.content)))
    bad = malformed_requests(SPEC.max_frames)
    victim = _health(ray_url)["replicas"][0]
    outcomes: dict[str, list] = {"latent": [], "stream": [], "bad": [], "big": [], "cut": []}

    async def client(i: int, started: asyncio.Event, progress: Progress) -> None:
        kind = i % 10
        if kind == 7:  # malformed: its 4xx at the first try, however busy the replicas are
            name, raw, opts = bad[(i // 10) % len(bad)]
            status, _, _ = await _exchange(ray_url, "/generate", raw, **opts)
            progress.answered()
            outcomes["bad"].append((name, status))
        elif kind == 8:  # oversized and still sending when the server has decided
            status, headers, payload = await _exchange(ray_url, "/generate", b" " * (1 << 20))
            progress.answered()
            outcomes["big"].append((status, headers.get("connection"), payload))
        elif kind == 9:  # cut: hangs up mid-upload, or mid-request (a latent or a stream)
            raw = json.dumps(bodies[i % len(bodies)]).encode()
            mid_upload = (i // 10) % 2 == 0
            path = "/generate/audio/stream" if (i // 10) % 4 == 3 else "/generate"
            await _exchange(
                ray_url, path, raw, send=len(raw) // 2 if mid_upload else None, hang_up=0.05
            )
            progress.answered()
            outcomes["cut"].append(mid_upload)
        elif kind == 6:  # streamed audio
            raw = json.dumps(bodies[i % len(bodies)]).encode()
            status, _, payload = await _until_not_503(
                ray_url, "/generate/audio/stream", raw, progress
            )
            outcomes["stream"].append((status, payload))
        else:
            which = i % len(bodies)
            raw = json.dumps(bodies[which]).encode()
            status, _, payload = await _until_not_503(ray_url, "/generate", raw, progress)
            outcomes["latent"].append((which, status, payload))
            if status == 200:
                started.set()

    async def load() -> None:
        progress = Progress()
        started = asyncio.Event()
        clients = [asyncio.ensure_future(client(i, started, progress)) for i in range(100)]
        # kill one replica once results flow, while most requests are still in flight
        await asyncio.wait_for(started.wait(), STALL_S)
        os.kill(victim["pid"], signal.SIGKILL)
        await _gather_while_answered(clients, progress)  # nobody hangs

    asyncio.run(load())

    # every valid latent request was served, with the single server's output
    assert len(outcomes["latent"]) == 60
    statuses = [status for _, status, _ in outcomes["latent"]]
    assert statuses == [200] * 60, statuses
    for which, _, payload in outcomes["latent"]:
        np.testing.assert_allclose(
            np.load(io.BytesIO(payload)), reference[which], atol=1e-4, rtol=1e-4
        )
    # a stream is whole, or (its replica died after it had started) ends short; never hangs
    assert len(outcomes["stream"]) == 10
    for status, payload in outcomes["stream"]:
        assert status == 200, payload[:200]
        announced, present = _wav_lengths(payload)
        assert present <= announced
    assert sum(_wav_lengths(p)[0] == _wav_lengths(p)[1] for _, p in outcomes["stream"]) >= 5
    # every bad request got its 4xx, whatever the replicas were doing
    for name, status in outcomes["bad"]:
        assert 400 <= status < 500, (name, status)
    for status, connection, payload in outcomes["big"]:
        assert status == 413 and connection == "close"
        assert "limit is 65536" in json.loads(payload)["detail"]
    assert len(outcomes["cut"]) == 10

    # the cut requests were cancelled on their replicas: nothing is left running
    assert wait_for(
        lambda: _health(ray_url).get("in_flight") == 0 and _health(ray_url).get("active") == 0,
        timeout=READY_S,
    ), _health(ray_url)
    health = _health(ray_url)
    assert health["routing"].get("retried", 0) >= 1, health["routing"]
    # the oversized ones, and the malformed one that announced a huge body
    assert health["counts"].get("413", 0) >= 10, health["counts"]
    # Ray Serve replaced the killed replica: two ready ones again, neither of them the victim
    assert wait_for(
        lambda: (
            sum(
                r["fresh"] and r["ready"] and r["pid"] != victim["pid"]
                for r in _health(ray_url).get("replicas", [])
            )
            == 2
        ),
        timeout=READY_S,
        every=0.5,
    ), _health(ray_url)
    # the replaced replica is not listed as ready beside its replacement
    for row in _health(ray_url)["replicas"]:
        assert row["ready"] == (row["fresh"] and row["state"] == "ready"), row
    # valid requests at the far ends of the ranges are served, finite, never 500
    for name, body in extreme_requests():
        resp = httpx.post(f"{ray_url}/generate", json=body, timeout=STALL_S)
        assert resp.status_code == 200, (name, resp.text)
        assert np.isfinite(np.load(io.BytesIO(resp.content))).all(), name
    # and the new replica answers like the others
    for which, body in enumerate(bodies):
        resp = httpx.post(f"{ray_url}/generate", json=body, timeout=STALL_S)
        assert resp.status_code == 200, resp.text
        np.testing.assert_allclose(
            np.load(io.BytesIO(resp.content)), reference[which], atol=1e-4, rtol=1e-4
        )


def _full_replicas_answer_503_with_retry_after(ray_url):
    """Every replica's slots and queue taken and the ingress's waiting line full: a valid request
    is told to retry; a malformed one still gets its 4xx; closing the long ones frees it all."""
    long = json.dumps({"frames": 32, "cond_seed": 0, "cond_len": 4, "steps": 100_000}).encode()
    # both replicas up and idle first (an earlier test may have left one restarting)
    assert wait_for(
        lambda: (h := _health(ray_url)).get("replicas_ready") == 2 and h.get("in_flight") == 0,
        timeout=READY_S,
        every=0.5,
    ), _health(ray_url)

    async def fill_then_probe():
        host, port = ray_url.removeprefix("http://").split(":")
        holders = []
        # two replicas of 2 slots + 4 queued, and one replica's capacity waiting at the ingress
        for _ in range(2 * 6 + 6):
            _reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(long)}\r\n\r\n".encode()
                + long
            )
            await writer.drain()
            holders.append(writer)
        try:
            # the holders admitted up to the capacity (their bodies go through Ray's proxy first)
            admitted_by = time.monotonic() + READY_S
            while time.monotonic() < admitted_by:
                health = await asyncio.to_thread(_health, ray_url)
                if health.get("in_flight", 0) >= health.get("capacity", 1):
                    break
                await asyncio.sleep(0.1)
            assert health["in_flight"] == health["capacity"] == len(holders), health
            probe = json.dumps({"frames": 8, "cond_seed": 1, "cond_len": 4, "steps": 2}).encode()
            status, headers, payload = await asyncio.wait_for(
                _exchange(ray_url, "/generate", probe), STALL_S
            )
            assert status == 503, (status, payload[:200])
            assert headers.get("retry-after") == "1", headers
            bad_status, _, _ = await asyncio.wait_for(
                _exchange(ray_url, "/generate", b"{not json"), STALL_S
            )
            assert bad_status == 422
        finally:
            for writer in holders:
                writer.close()

    asyncio.run(fill_then_probe())
    # closing them cancelled them on their replicas: every slot is free again
    assert wait_for(
        lambda: (h := _health(ray_url)).get("in_flight") == 0 and h.get("active") == 0,
        timeout=READY_S,
    ), _health(ray_url)
    ok = httpx.post(
        f"{ray_url}/generate",
        json={"frames": 8, "cond_seed": 1, "cond_len": 4, "steps": 2},
        timeout=STALL_S,
    )
    assert ok.status_code == 200, ok.text


def test_options_parse_the_serve_run_arguments():
    opts = RayServeOptions.from_args(
        {
            "preset": "tiny",
            "depth": "2",
            "max_queue": "6",
            "min_replicas": "1",
            "max_replicas": "4",
            "max_body_bytes": "1000",
            "warmup_frames": "8,16",
            "warmup": "false",
        }
    )
    assert opts.spec.depth == 2 and opts.spec.warmup_frames == (8, 16) and not opts.spec.warmup
    assert opts.limits == {"max_body_bytes": 1000}
    assert opts.autoscaling_config() == {
        "min_replicas": 1,
        "max_replicas": 4,
        "target_ongoing_requests": 2.0,
    }
    assert opts.replica_capacity == 8 and opts.most_replicas == 4
    deployment = replica_deployment_options(opts, gpus=1.0)
    assert deployment["autoscaling_config"] == opts.autoscaling_config()
    assert "num_replicas" not in deployment and deployment["max_ongoing_requests"] == 8
    assert deployment["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 1.0}
    fixed = replica_deployment_options(RayServeOptions(replicas=3), gpus=0.0)
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert RayServeOptions(replicas=3).autoscaling_config() is None
    with pytest.raises(ValueError, match="unknown stream-dit option"):
        RayServeOptions.from_args({"replica": "2"})
    with pytest.raises(ValueError, match="not both"):
        RayServeOptions(replicas=2, max_replicas=3)
    with pytest.raises(ValueError, match="depth='two'"):
        RayServeOptions.from_args({"depth": "two"})
