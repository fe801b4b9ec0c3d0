"""A small run of the load benchmark: concurrent, careless and hostile clients on loopback."""

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from stream_dit.serve_load import LoadConfig, extreme_requests, malformed_requests, run_load


def test_small_load_run_on_cpu():
    cfg = LoadConfig(
        clients=30, depth=2, max_queue=4, frames=(8, 16), steps=3, distinct=4, retries=50
    )
    res = run_load(cfg)
    kinds = len(malformed_requests(16))
    assert res.server_5xx == 0 and res.rejected_503 == 0, res.statuses
    assert res.mismatched == 0 and res.max_abs_diff < 1e-4
    malformed = 30 // cfg.malformed_every
    assert res.client_4xx == malformed and len(res.statuses) >= 2 + min(kinds, malformed)
    # a number that overflows float32 is refused as a bad request, a bool or a numeric string
    # where an int goes as a malformed one; none of them is served
    assert res.statuses.get("400 overflowing_guidance") == 1, res.statuses
    assert res.statuses.get("422 bool_for_int") == 1, res.statuses
    assert res.statuses.get("422 numeric_string") == 1, res.statuses
    # finite states past any encoder's are refused up front, not answered 500 after the model
    assert res.statuses.get("400 huge_cond_values") == 1, res.statuses
    # valid requests at the far ends of the ranges are served, finite
    extremes = {k: n for k, n in res.statuses.items() if " extreme " in k}
    assert sum(extremes.values()) == 30 // cfg.extreme_every, res.statuses
    assert all(k.startswith("200 ") for k in extremes), extremes
    assert len(extremes) == min(len(extreme_requests()), 30 // cfg.extreme_every)
    assert res.disconnected == 3 and res.completed == 30 - malformed - 3
    assert res.server_counts.get("503", 0) > 0  # the small queue did push back
    assert res.rss_before_mb is None or res.rss_after_mb - res.rss_before_mb < 200
    assert res.latency_ms["p99"] >= res.latency_ms["p50"] > 0
