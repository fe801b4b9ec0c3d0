import io
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from serve_test_helpers import serving  # noqa: E402

from stream_dit import Request, StreamSession, TorchEngine  # noqa: E402
from stream_dit.server import create_app  # noqa: E402


@pytest.fixture(scope="module")
def server(tiny_model):
    session = StreamSession(
        tiny_model, TorchEngine(tiny_model, max_batch=8, max_frames=64, max_cond_len=16), depth=4
    )
    with serving(create_app(session)) as url:
        yield url, session


def _post(url, body):
    with httpx.Client(timeout=60) as client:
        # json.dumps writes Infinity/NaN tokens, which a client library would refuse to send
        return client.post(
            f"{url}/generate",
            content=json.dumps(body),
            headers={"content-type": "application/json"},
        )


def test_concurrent_requests_and_bad_ones_get_4xx(server):
    url, session = server
    good = [
        {"frames": 8 + i, "cond_seed": i, "cond_len": 3, "seed": i, "steps": 3} for i in range(6)
    ]
    bad = [
        ({"frames": 8, "cond_seed": 0, "colour": "red"}, 422, "colour"),
        ({"frames": 500, "cond_seed": 0}, 400, "exceeds"),
        ({"frames": 8, "cond_seed": 0, "noise": [0.1, float("inf")]}, 422, "noise"),
        ({"frames": 8, "cond": [[1.0, 2.0]]}, 400, "cond"),
        ({"frames": 8}, 400, "cond"),
    ]
    with ThreadPoolExecutor(8) as pool:
        goods = [pool.submit(_post, url, b) for b in good]
        bads = [pool.submit(_post, url, b) for b, _, _ in bad]
        good_resp = [f.result() for f in goods]
        bad_resp = [f.result() for f in bads]
    for (_, code, reason), resp in zip(bad, bad_resp):
        assert resp.status_code == code, resp.text
        assert reason in resp.text
    for body, resp in zip(good, good_resp):
        assert resp.status_code == 200, resp.text
        latent = np.load(io.BytesIO(resp.content))
        assert latent.shape == (body["frames"], 64) and np.isfinite(latent).all()
    # the served latent equals the same request run directly
    body = good[2]
    cond = torch.randn(3, 32, generator=torch.Generator().manual_seed(body["cond_seed"]))
    ref = StreamSession(session.adapter, depth=1)
    h = ref.submit(Request(frames=body["frames"], cond=cond, seed=body["seed"], steps=3))
    ref.run_until_idle()
    np.testing.assert_allclose(
        np.load(io.BytesIO(good_resp[2].content)), h.result.numpy(), rtol=1e-5, atol=1e-5
    )
    with httpx.Client() as client:
        assert client.get(f"{url}/health").json()["depth"] == 4
