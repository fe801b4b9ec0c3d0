"""Parity rail: fixed scenarios through the tiny model, compared with committed captures.

Re-bless (after an intended numerical change) with::

    STREAM_DIT_BLESS=1 uv run pytest packages/stream-dit -k parity

Captures are compared with ``rtol = atol = 1e-4``: the tiny model's matmuls run on whatever BLAS
the host has, so bit-equality across machines is not promised. Identities whose arithmetic is the
same on both sides (plain rows via ``torch._foreach_*`` vs the per-slot path) are checked exactly in
``test_session.py``; fused vs two-pass CFG is checked here within the run at the same tolerance.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from stream_dit import Request, StreamSession, TorchEngine, build_model

CAPTURES = Path(__file__).parent / "captures" / "parity.pt"
BLESS = os.environ.get("STREAM_DIT_BLESS", "") not in ("", "0")
TOL = {"rtol": 1e-4, "atol": 1e-4}


def _cond(seed: int, length: int) -> torch.Tensor:
    return torch.randn(length, 32, generator=torch.Generator().manual_seed(seed))


def _mask(length: int, valid: int) -> torch.Tensor:
    return torch.arange(length) < valid


def _scenarios() -> dict[str, tuple[list[Request], dict]]:
    init = torch.randn(12, 64, generator=torch.Generator().manual_seed(99))
    neg = _cond(50, 3)
    return {
        "plain_ode": ([Request(frames=12, cond=_cond(1, 4), seed=1, steps=4, shift=3.0)], {}),
        "partial_denoise": (
            [Request(frames=12, cond=_cond(2, 4), seed=2, steps=8, denoise=0.5, init_latent=init)],
            {},
        ),
        "sde_noise": (
            [Request(frames=12, cond=_cond(3, 4), seed=3, steps=4, noise=[0.4, 0.0])],
            {},
        ),
        "padded_multi_condition": (
            [
                Request(frames=9, cond=_cond(4, 2), seed=4, steps=3),
                Request(frames=16, cond=_cond(5, 6), cond_mask=_mask(6, 4), seed=5, steps=5),
                Request(frames=5, cond=_cond(6, 1), seed=6, steps=4),
            ],
            {"depth": 3},
        ),
        "full_cfg": (
            [
                Request(
                    frames=12,
                    cond=_cond(7, 4),
                    negative=neg,
                    seed=7,
                    steps=4,
                    cfg_type="full",
                    guidance=4.0,
                )
            ],
            {},
        ),
        "rcfg_self": (
            [Request(frames=12, cond=_cond(8, 4), seed=8, steps=4, cfg_type="self", guidance=2.0)],
            {},
        ),
        "rcfg_initialize": (
            [
                Request(
                    frames=12,
                    cond=_cond(9, 4),
                    negative=neg,
                    seed=9,
                    steps=4,
                    cfg_type="initialize",
                    guidance=2.0,
                )
            ],
            {},
        ),
        "shared_curves": (
            [
                Request(
                    frames=12, cond=_cond(10, 4), seed=10, steps=4, cfg_type="full", guidance=2.0
                )
            ],
            {"shared": {"velocity_scale": [1.0, 0.8], "guidance": [1.0, 1.5]}},
        ),
    }


def _run(
    requests: list[Request], depth: int = 1, shared: dict | None = None, **session_kw
) -> list[torch.Tensor]:
    model = build_model("tiny", seed=0)
    engine = session_kw.pop("engine", None) or TorchEngine(model, max_batch=2 * depth)
    session = StreamSession(model, engine, depth=depth, **session_kw)
    if shared:
        session.set_shared_curves(**shared)
    handles = [session.submit(Request(**r.__dict__)) for r in requests]
    session.run_until_idle()
    assert all(h.result is not None for h in handles), [h.error for h in handles]
    return [h.result for h in handles]


@pytest.fixture(scope="module")
def captures() -> dict:
    if BLESS:
        return {}
    if not CAPTURES.exists():
        pytest.fail(f"{CAPTURES} is missing; create it with STREAM_DIT_BLESS=1")
    return torch.load(CAPTURES)


_BLESSED: dict = {}


@pytest.mark.parametrize("name", list(_scenarios()))
def test_parity_scenario(name, captures):
    requests, kw = _scenarios()[name]
    results = _run(requests, depth=kw.get("depth", 1), shared=kw.get("shared"))
    if BLESS:
        _BLESSED[name] = [r.clone() for r in results]
        stored = torch.load(CAPTURES) if CAPTURES.exists() else {}
        stored[name] = _BLESSED[name]
        CAPTURES.parent.mkdir(parents=True, exist_ok=True)
        torch.save(stored, CAPTURES)
        return
    expected = captures[name]
    assert len(expected) == len(results)
    for got, want in zip(results, expected):
        torch.testing.assert_close(got, want, **TOL)


def test_parity_fused_vs_two_pass_cfg():
    requests, _ = _scenarios()["full_cfg"]
    requests = requests * 2
    fused = _run(requests, depth=2)
    # a ceiling of 2 with 2 slots and 2 negatives forces two passes; per-slot CFG, no kernel
    model = build_model("tiny", seed=0)
    two_pass = _run(requests, depth=2, engine=TorchEngine(model, max_batch=2), fused_cfg=False)
    for a, b in zip(fused, two_pass):
        torch.testing.assert_close(a, b, **TOL)
