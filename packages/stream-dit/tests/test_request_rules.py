"""Requests a user can trust the answer to: numbers in ranges that keep every step finite, strict
types (a bool is not an int, a string not a number), and never a 200 with NaN in it."""

import json
import math

import pytest
import torch
from torch import nn

from stream_dit import Request, StreamSession, TorchEngine
from stream_dit.request import MAX_MAGNITUDE, MAX_STATE_MAGNITUDE, NUMBER_RANGES
from stream_dit.session import LATENT_LIMIT


def _validate(**fields) -> Request:
    request = Request(**{"frames": 8, "cond": torch.zeros(2, 32), **fields})
    request.validate(channels=64, cond_dim=32, max_frames=64, max_cond_len=8)
    return request


@pytest.mark.parametrize(
    "field,value",
    [
        ("guidance", 1e39),  # finite in Python, inf in float32: the latent would be NaN
        ("guidance", -1e30),
        ("shift", 1e39),
        ("shift", 0.0),
        ("apg_eta", 1e300),
        ("apg_norm_threshold", -1.0),
        ("apg_momentum", 2.0),
        ("cfg_rescale", 1.5),
        ("denoise", 0.0),
        ("velocity_scale", [1.0, 1e39]),
        ("guidance_curve", [1e30]),
        ("noise", [0.0, 1e39]),
        ("dcw", (0.1, 1e39)),
        ("seed", -1),
        ("seed", 2**64),
        ("steps", 0),
    ],
)
def test_numbers_out_of_range_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field.split("_")[0]):
        _validate(**{field: value})


@pytest.mark.parametrize(
    "field,value",
    [
        ("frames", True),
        ("frames", "100"),
        ("frames", 8.0),
        ("steps", True),
        ("seed", "3"),
        ("seed", False),
        ("guidance", True),
        ("guidance", "4.0"),
        ("shift", None),
        ("velocity_scale", [1.0, True]),
        ("noise", ["0.5"]),
        ("noise", "0.5"),
        ("dcw", (0.1, "0.2")),
        ("stream", 1),
    ],
)
def test_wrong_types_are_type_errors_naming_the_field(field, value):
    with pytest.raises(TypeError, match=field):
        _validate(**{field: value})


def test_the_edges_of_each_range_are_accepted():
    for name, (low, high, low_included) in NUMBER_RANGES.items():
        _validate(**{name: high})
        if low_included:
            _validate(**{name: low})
    _validate(seed=2**63 - 1, velocity_scale=[MAX_MAGNITUDE, -MAX_MAGNITUDE], dcw=(1, 0))
    assert _validate(dcw=[0.5, 1]).dcw == (0.5, 1.0)


def test_state_tensors_past_the_magnitude_bound_are_refused_naming_them():
    big = MAX_STATE_MAGNITUDE * 2
    _validate(cond=torch.full((2, 32), MAX_STATE_MAGNITUDE))  # the bound itself is taken
    for name, fields in (
        ("cond", {"cond": torch.full((2, 32), 3e38)}),
        ("negative", {"negative": torch.full((1, 32), -big)}),
        ("init_latent", {"denoise": 0.5, "init_latent": torch.full((8, 64), big)}),
    ):
        with pytest.raises(ValueError, match=f"{name} values must lie in"):
            _validate(**fields)


@pytest.mark.parametrize("cfg_type", ["self", "initialize", "full"])
def test_residual_guidance_at_the_range_end_saturates_instead_of_overflowing(tiny_model, cfg_type):
    """Residual CFG multiplies the latent by ~(1 + g·dt) a step: at g = ±1000 over 200 steps it
    would pass float32's range; the latent is held within ±LATENT_LIMIT, finite."""
    session = StreamSession(tiny_model, TorchEngine(tiny_model, max_batch=2, max_frames=32), depth=1)
    for g in (MAX_MAGNITUDE, -MAX_MAGNITUDE):
        cond = torch.randn(3, 32, generator=torch.Generator().manual_seed(1))
        h = session.submit(Request(frames=16, cond=cond, steps=200, guidance=g, cfg_type=cfg_type,
                                   guidance_curve=[MAX_MAGNITUDE]))  # fmt: skip
        session.run_until_idle()
        assert torch.isfinite(h.result).all() and h.result.abs().max() <= LATENT_LIMIT
    # a sensible request never meets the bound
    h = session.submit(Request(frames=16, cond=cond, steps=8, guidance=3.0, cfg_type=cfg_type))
    session.run_until_idle()
    assert h.result.abs().max() < 100


class _Diverging(nn.Module):
    """A denoiser whose velocity is NaN: what a broken checkpoint or an overflow would give."""

    latent_channels, cond_dim, context_channels = 64, 32, 0

    def forward(self, x, t, states, states_mask, frame_mask=None, context=None):
        return torch.full_like(x, float("nan"))


@pytest.fixture(scope="module")
def servers(tiny_model):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from serve_test_helpers import serving

    from stream_dit.server import create_app

    good = StreamSession(tiny_model, TorchEngine(tiny_model, max_batch=2, max_frames=32), depth=1)
    bad = _Diverging()
    broken = StreamSession(bad, TorchEngine(bad, max_batch=2, max_frames=32, device="cpu"), depth=1)
    with serving(create_app(good, warmup=False)) as url, serving(
        create_app(broken, warmup=False)
    ) as broken_url:  # fmt: skip
        yield url, broken_url


def _post(url: str, body: dict | bytes):
    httpx = pytest.importorskip("httpx")
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}/generate", content=raw, timeout=60,
                      headers={"content-type": "application/json"})  # fmt: skip


def test_server_refuses_overflowing_numbers_and_loose_types(servers):
    url, _ = servers
    ok = {"frames": 8, "cond_seed": 1, "cond_len": 3, "steps": 2}
    assert _post(url, ok).status_code == 200
    assert _post(url, {**ok, "guidance": 2, "dcw": [0, 1]}).status_code == 200  # ints are numbers
    for field, value in (("guidance", 1e39), ("shift", 1e39), ("guidance", 1e300),
                         ("velocity_scale", [1.0, 1e39])):  # fmt: skip
        resp = _post(url, {**ok, field: value, "cfg_type": "full"})
        assert resp.status_code == 400 and field in resp.text, (field, resp.text)
    for field, value in (("frames", True), ("frames", "100"), ("steps", 2.0), ("guidance", "2"),
                         ("seed", False), ("dcw", [0.1, True]), ("dcw", [0.1])):  # fmt: skip
        resp = _post(url, {**ok, field: value})
        assert resp.status_code == 422 and field in resp.text, (field, resp.text)


def test_a_non_finite_result_is_an_error_not_a_200(servers):
    _, broken_url = servers
    resp = _post(broken_url, {"frames": 8, "cond_seed": 1, "cond_len": 3, "steps": 2})
    assert resp.status_code == 500
    assert "NaN" in resp.text and not math.isnan(len(resp.content))
