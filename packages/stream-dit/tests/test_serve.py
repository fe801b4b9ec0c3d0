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


def _direct(session, **fields):
    """The latent of the same request run on a fresh session of ``session``'s model."""
    ref = StreamSession(session.adapter, depth=1)
    h = ref.submit(Request(**fields))
    ref.run_until_idle()
    return h.result.numpy()


def test_init_latent_and_apg_options_travel_over_http(server):
    """``denoise < 1`` works over HTTP (with ``init_latent``), and the ``apg_*`` fields the README
    lists are taken, each giving the latent of the same request run directly."""
    url, session = server
    cond = torch.randn(3, 32, generator=torch.Generator().manual_seed(5))
    init = torch.randn(12, 64, generator=torch.Generator().manual_seed(6))
    common = {"frames": 12, "cond_seed": 5, "cond_len": 3, "seed": 7, "steps": 4}
    body = {**common, "denoise": 0.5, "init_latent": init.tolist()}
    resp = _post(url, body)
    assert resp.status_code == 200, resp.text
    direct = _direct(session, frames=12, cond=cond, seed=7, steps=4, denoise=0.5, init_latent=init)
    np.testing.assert_allclose(np.load(io.BytesIO(resp.content)), direct, rtol=1e-5, atol=1e-5)
    apg = {"cfg_type": "full", "guidance": 3.0, "guidance_mode": "apg", "apg_momentum": 0.3,
           "apg_norm_threshold": 2.0, "apg_eta": 0.5}  # fmt: skip
    resp = _post(url, {**common, **apg})
    assert resp.status_code == 200, resp.text
    direct = _direct(session, frames=12, cond=cond, seed=7, steps=4, **apg)
    np.testing.assert_allclose(np.load(io.BytesIO(resp.content)), direct, rtol=1e-5, atol=1e-5)
    for bad, code, reason in (
        ({**body, "init_latent": init[:, :10].tolist()}, 400, "init_latent must have shape"),
        ({**body, "init_latent": init[:5].tolist()}, 400, "init_latent must have shape (12, 64)"),
        ({**body, "init_latent": [[1e30] * 64] * 12}, 400, "init_latent values must lie in"),
        ({**common, "apg_momentum": 2.0}, 400, "apg_momentum"),
    ):
        resp = _post(url, bad)
        assert resp.status_code == code and reason in resp.text, (reason, resp.text)


def test_finite_requests_at_the_range_ends_are_served_or_refused_never_500(server):
    url, _ = server
    from stream_dit.serve_load import extreme_requests

    for name, body in extreme_requests():
        resp = _post(url, body)
        assert resp.status_code == 200, (name, resp.text)
        assert np.isfinite(np.load(io.BytesIO(resp.content))).all(), name
    for values in ([[3e38] * 32], [[1e30] * 32] * 3, [[-2e4] + [0.0] * 31]):
        resp = _post(url, {"frames": 8, "cond": values})
        assert resp.status_code == 400 and "cond values must lie in" in resp.text, resp.text
    resp = _post(url, {"frames": 8, "cond_seed": 1, "negative": [[1e5] * 32]})
    assert resp.status_code == 400 and "negative values" in resp.text, resp.text


def test_every_route_refuses_query_parameters_it_does_not_take(server):
    url, _ = server
    body = json.dumps({"frames": 8, "cond_seed": 1, "steps": 2})
    with httpx.Client(timeout=60) as client:
        for query in ("bogus=1", "format=f32"):
            resp = client.post(f"{url}/generate?{query}", content=body)
            assert resp.status_code == 422, (query, resp.text)
            detail = resp.json()["detail"]
            assert detail[0]["field"] == query.split("=")[0] and "takes none" in detail[0]["reason"]
        assert client.post(f"{url}/generate", content=body).status_code == 200
