"""Load test of ``stream-dit serve``: many concurrent clients, some careless, some hostile.

:func:`run_load` starts a server in a subprocess on 127.0.0.1 (loopback only; with ``ray``, the Ray
Serve deployment of ``stream-dit serve --ray`` with ``replicas`` replicas), sends ``clients``
concurrent requests over raw HTTP/1.1 (standard library only, so it runs wherever the server does):
good ones with mixed frames and CFG on and off, some that disconnect mid-request or mid-upload,
some malformed or oversized. It reports completed / 4xx / 5xx counts, latency percentiles, the
server's RSS before and after, and checks every completed latent against the same request run alone
on the idle server afterwards, and the throughput (completions per second of the load). Every wait
is bounded; the server is stopped on the way out.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

LOOPBACK = "127.0.0.1"


@dataclass
class LoadConfig:
    """What the load test sends and what the server it starts looks like."""

    clients: int = 200
    preset: str = "tiny"
    device: str = "cpu"
    dtype: str = "float32"
    depth: int = 4
    max_queue: int = 64
    frames: tuple[int, ...] = (16, 32, 64)
    steps: int = 4
    cond_len: int = 6
    distinct: int = 12
    disconnect_every: int = 10
    malformed_every: int = 7
    extreme_every: int = 11
    retries: int = 3
    request_timeout_s: float = 120.0
    run_timeout_s: float = 300.0
    startup_timeout_s: float = 120.0
    atol: float = 1e-4
    rtol: float = 1e-4
    ray: bool = False
    replicas: int = 1
    ray_cpus: int | None = None
    torch_threads: int | None = None


@dataclass
class LoadResult:
    config: dict[str, Any]
    statuses: dict[str, int]
    completed: int
    client_4xx: int
    server_5xx: int
    rejected_503: int
    disconnected: int
    latency_ms: dict[str, float]
    alone_ms: float
    rss_before_mb: float | None
    rss_after_mb: float | None
    mismatched: int
    max_abs_diff: float
    server_counts: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def completions_per_s(self) -> float:
        """Requests answered 200 per second of the load (retries after a 503 included)."""
        return self.completed / self.wall_s if self.wall_s > 0 else 0.0

    def table(self) -> str:
        rows = [
            ("clients", self.config["clients"]),
            ("completed", self.completed),
            ("4xx (malformed, oversized)", self.client_4xx),
            ("503 after retries", self.rejected_503),
            ("5xx other than 503", self.server_5xx),
            ("disconnected mid-request", self.disconnected),
            (
                "p50 / p99 latency ms",
                f"{self.latency_ms['p50']:.1f} / {self.latency_ms['p99']:.1f}",
            ),
            ("same request alone ms (median)", f"{self.alone_ms:.1f}"),
            ("server RSS before / after MB", f"{self.rss_before_mb} / {self.rss_after_mb}"),
            ("results != alone (max |diff|)", f"{self.mismatched} ({self.max_abs_diff:.2e})"),
            ("wall s", f"{self.wall_s:.1f}"),
            ("completions / s", f"{self.completions_per_s:.2f}"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


# ------------------------------------------------------------------ raw HTTP on asyncio streams
async def _http(
    port: int,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    declared: int | None = None,
    send: int | None = None,
    hang_up_after: float | None = None,
    timeout: float = 60.0,
) -> tuple[int, dict[str, str], bytes] | None:
    """One request on its own connection; ``None`` when we hung up on purpose."""

    async def exchange():
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        try:
            n = len(body) if declared is None else declared
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: {LOOPBACK}\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\nContent-Length: {n}\r\n\r\n"
            )
            writer.write(head.encode() + body[: len(body) if send is None else send])
            await writer.drain()
            if hang_up_after is not None:
                await asyncio.sleep(hang_up_after)
                return None
            return _parse_response(await reader.read())
        finally:
            writer.close()

    return await asyncio.wait_for(exchange(), timeout)


def _parse_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, payload = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, payload


# ------------------------------------------------------------------ the workload
def good_bodies(cfg: LoadConfig) -> list[dict[str, Any]]:
    """The distinct well-formed requests: mixed frames, CFG on and off."""
    bodies = []
    for i in range(cfg.distinct):
        body = {
            "frames": cfg.frames[i % len(cfg.frames)],
            "cond_seed": i,
            "cond_len": cfg.cond_len,
            "seed": 100 + i,
            "steps": cfg.steps,
            "shift": 3.0,
        }
        if i % 2:
            body.update(cfg_type="full", guidance=3.0)
        bodies.append(body)
    return bodies


def malformed_requests(max_frames: int) -> list[tuple[str, bytes, dict[str, Any]]]:
    """``(kind, body, options)`` for requests a careless or hostile client sends."""
    ok = {"frames": 8, "cond_seed": 1, "cond_len": 4}
    return [
        # first the numbers a lax parser would take: a finite JSON number that overflows
        # float32 (400), a bool and a numeric string for an int (422)
        ("overflowing_guidance", json.dumps({**ok, "guidance": 1e39}).encode(), {}),
        ("bool_for_int", json.dumps({**ok, "frames": True}).encode(), {}),
        ("numeric_string", json.dumps({**ok, "frames": "100"}).encode(), {}),
        # finite, but past any encoder state: it would overflow inside the model (400)
        ("huge_cond_values", json.dumps({"frames": 8, "cond": [[1e30] * 4]}).encode(), {}),
        ("not_json", b'{"frames": 8, "cond_seed"', {}),
        ("unknown_field", json.dumps({**ok, "colour": "red"}).encode(), {}),
        ("huge_cond_len", json.dumps({**ok, "cond_len": 20_000_000}).encode(), {}),
        ("huge_frames", json.dumps({**ok, "frames": max_frames * 1000}).encode(), {}),
        ("nan", b'{"frames": 8, "cond_seed": 1, "guidance": NaN}', {}),
        ("declared_huge", json.dumps(ok).encode(), {"declared": 1 << 40, "send": 16}),
        ("wrong_type", json.dumps({**ok, "steps": "lots"}).encode(), {}),
    ]


def extreme_requests() -> list[tuple[str, dict[str, Any]]]:
    """``(kind, body)`` for valid requests at the far ends of the accepted ranges: each must be
    served (200, finite), never answered 500."""
    ok = {"frames": 8, "cond_seed": 1, "cond_len": 4, "steps": 12}
    return [
        ("initialize_-1000", {**ok, "cfg_type": "initialize", "guidance": -1000.0}),
        ("self_curve_1000", {**ok, "cfg_type": "self", "guidance": 1000.0,
                             "guidance_curve": [1000.0], "velocity_scale": [1000.0]}),
        ("full_apg_1000", {**ok, "cfg_type": "full", "guidance": -1000.0, "guidance_mode": "apg",
                           "apg_eta": 1000.0, "apg_norm_threshold": 1000.0, "dcw": [1000.0, -1000.0]}),
    ]  # fmt: skip


async def _with_retries(port: int, raw: bytes, cfg: LoadConfig, **opts) -> tuple:
    """POST until the answer is not 503 (honouring Retry-After) or the retries run out."""
    for attempt in range(cfg.retries + 1):
        start = time.perf_counter()
        status, headers, payload = await _http(
            port, "POST", "/generate", raw, timeout=cfg.request_timeout_s + 10, **opts
        )
        if status != 503 or attempt == cfg.retries:
            return status, payload, (time.perf_counter() - start) * 1e3
        await asyncio.sleep(float(headers.get("retry-after", "1")))
    raise AssertionError("unreachable")


async def _client(
    i: int, port: int, cfg: LoadConfig, bodies: list[dict], bad: list, out: dict
) -> None:
    if cfg.malformed_every and i % cfg.malformed_every == cfg.malformed_every - 1:
        kind, raw, opts = bad[(i // cfg.malformed_every) % len(bad)]
        # one try: a request that can never succeed gets its 4xx even in a burst, never a 503
        status, _, _ = await _http(
            port, "POST", "/generate", raw, timeout=cfg.request_timeout_s + 10, **opts
        )
        out["statuses"][f"{status} {kind}"] += 1
        return
    if cfg.extreme_every and i % cfg.extreme_every == cfg.extreme_every - 1:
        extremes = extreme_requests()
        kind, body = extremes[(i // cfg.extreme_every) % len(extremes)]
        status, payload, _ = await _with_retries(port, json.dumps(body).encode(), cfg)
        if status == 200 and not np.isfinite(np.load(io.BytesIO(payload))).all():
            status = "non-finite"
        out["statuses"][f"{status} extreme {kind}"] += 1
        return
    which = i % len(bodies)
    raw = json.dumps(bodies[which]).encode()
    if cfg.disconnect_every and i % cfg.disconnect_every == cfg.disconnect_every - 1:
        mid_upload = (i // cfg.disconnect_every) % 2 == 0
        await _http(
            port,
            "POST",
            "/generate",
            raw,
            send=len(raw) // 2 if mid_upload else None,
            hang_up_after=0.002 * (i % 5),
        )
        out["statuses"]["hung up " + ("mid-upload" if mid_upload else "mid-request")] += 1
        return
    status, payload, ms = await _with_retries(port, raw, cfg)
    out["statuses"][str(status)] += 1
    if status == 200:
        out["latency_ms"].append(ms)
        out["results"].append((which, np.load(io.BytesIO(payload))))


async def _health(port: int) -> dict[str, Any]:
    status, _, payload = await _http(port, "GET", "/health", timeout=10)
    return json.loads(payload) | {"http_status": status}


async def _until_idle(port: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        h = await _health(port)
        if (h["in_flight"] == 0 and h["active"] == 0 and h["queued"] == 0) or (
            time.monotonic() > deadline
        ):
            return h
        await asyncio.sleep(0.05)


async def _drive(port: int, pid: int, cfg: LoadConfig) -> LoadResult:
    bodies = good_bodies(cfg)
    bad = malformed_requests(max(cfg.frames))
    # warm every request shape once so RSS "before" holds the model and its buffers
    alone: dict[int, np.ndarray] = {}
    alone_ms = []
    for which, body in enumerate(bodies):
        start = time.perf_counter()
        status, _, payload = await _http(
            port, "POST", "/generate", json.dumps(body).encode(), timeout=cfg.request_timeout_s
        )
        alone_ms.append((time.perf_counter() - start) * 1e3)
        if status != 200:
            raise RuntimeError(f"warm-up request {body} answered {status}: {payload[:200]!r}")
        alone[which] = np.load(io.BytesIO(payload))
    rss_before = rss_mb(pid)
    out: dict[str, Any] = {"statuses": Counter(), "latency_ms": [], "results": []}
    start = time.perf_counter()
    await asyncio.wait_for(
        asyncio.gather(*(_client(i, port, cfg, bodies, bad, out) for i in range(cfg.clients))),
        cfg.run_timeout_s,
    )
    wall = time.perf_counter() - start
    health = await _until_idle(port, timeout=30)
    rss_after = rss_mb(pid)
    # the alone runs above came before the load; run them again after it, so a server whose
    # state the load corrupted would show up as a mismatch too
    for which, body in enumerate(bodies):
        status, _, payload = await _http(
            port, "POST", "/generate", json.dumps(body).encode(), timeout=cfg.request_timeout_s
        )
        if status != 200:
            raise RuntimeError(f"request {body} after the load answered {status}: {payload[:300]!r}")
        again = np.load(io.BytesIO(payload))
        if not np.allclose(again, alone[which], atol=cfg.atol, rtol=cfg.rtol):
            out["results"].append((which, again))
    mismatched, max_diff = 0, 0.0
    for which, latent in out["results"]:
        ref = alone[which]
        diff = float(np.abs(latent - ref).max()) if latent.shape == ref.shape else float("inf")
        max_diff = max(max_diff, diff)
        mismatched += not (
            latent.shape == ref.shape and np.allclose(latent, ref, atol=cfg.atol, rtol=cfg.rtol)
        )
    statuses = dict(out["statuses"])
    codes = Counter()
    for key, n in statuses.items():
        codes[key.split()[0]] += n
    lat = sorted(out["latency_ms"]) or [float("nan")]
    return LoadResult(
        config={**asdict(cfg), "port": port},
        statuses=statuses,
        completed=codes["200"],
        client_4xx=sum(n for c, n in codes.items() if c.startswith("4")),
        server_5xx=sum(n for c, n in codes.items() if c.startswith("5") and c != "503"),
        rejected_503=codes["503"],
        disconnected=codes["hung"],
        latency_ms={
            "p50": float(np.percentile(lat, 50)),
            "p99": float(np.percentile(lat, 99)),
            "max": float(lat[-1]),
        },
        alone_ms=statistics.median(alone_ms),
        rss_before_mb=rss_before,
        rss_after_mb=rss_after,
        mismatched=mismatched,
        max_abs_diff=max_diff,
        server_counts=health.get("counts", {}),
        wall_s=wall,
    )


# ------------------------------------------------------------------ the server process
def rss_mb(pid: int) -> float | None:
    """Resident set size of ``pid`` in MB (Linux ``/proc``; ``None`` elsewhere)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def server_command(cfg: LoadConfig, port: int) -> list[str]:
    return _single_server_command(cfg, port) + (_ray_flags(cfg) if cfg.ray else [])


def _ray_flags(cfg: LoadConfig) -> list[str]:
    flags = ["--ray", "--replicas", str(cfg.replicas)]
    if cfg.ray_cpus is not None:
        flags += ["--ray-cpus", str(cfg.ray_cpus)]
    if cfg.torch_threads is not None:
        flags += ["--torch-threads", str(cfg.torch_threads)]
    return flags


def _single_server_command(cfg: LoadConfig, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "stream_dit.cli",
        "serve",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--preset",
        cfg.preset,
        "--device",
        cfg.device,
        "--dtype",
        cfg.dtype,
        "--depth",
        str(cfg.depth),
        "--max-queue",
        str(cfg.max_queue),
        "--max-frames",
        str(max(cfg.frames)),
        "--max-cond-len",
        str(max(16, cfg.cond_len)),
        "--request-timeout",
        str(cfg.request_timeout_s),
        "--log-level",
        "warning",
    ]


def _wait_ready(proc: subprocess.Popen, port: int, timeout: float, replicas: int = 1) -> None:
    """Until ``/health`` reports ready (and, behind Ray Serve, ``replicas`` replicas ready)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            h = asyncio.run(_health(port))
            if h["ready"] and h.get("replicas_ready", replicas) >= replicas:
                return
        except (OSError, asyncio.TimeoutError, ValueError, KeyError, IndexError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the server was not ready within {timeout} s")


def run_load(cfg: LoadConfig) -> LoadResult:
    """Start a server, run the load against it, stop it; see the module docstring."""
    port = free_port()
    env = dict(os.environ)
    # the child imports stream_dit the way this process does (installed or from src folders)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.Popen(server_command(cfg, port), env=env)
    try:
        _wait_ready(proc, port, cfg.startup_timeout_s, cfg.replicas if cfg.ray else 1)
        return asyncio.run(_drive(port, proc.pid, cfg))
    finally:
        proc.terminate()
        try:
            # a Ray Serve deployment deletes its application and stops Ray first
            proc.wait(timeout=60 if cfg.ray else 15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
