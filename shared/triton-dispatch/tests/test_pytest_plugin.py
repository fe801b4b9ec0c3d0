"""The pytest plugin under pytest-xdist: one session seed over every worker, and PyTorch's threads
shared between the workers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("xdist")

_SUITE = textwrap.dedent(
    """
    import json, os
    import pytest
    import torch
    from triton_dispatch.pytest_plugin import _SEED_KEY

    @pytest.mark.parametrize("case", range(6))
    def test_record(request, seed, case):
        record = {
            "worker": os.environ.get("PYTEST_XDIST_WORKER"),
            "session_seed": request.config.stash[_SEED_KEY],
            "threads": torch.get_num_threads(),
        }
        path = os.path.join(os.environ["RECORDS"], f"{case}.json")
        with open(path, "w") as f:
            json.dump(record, f)
    """
)


def _run(tmp_path) -> tuple[str, list[dict]]:
    suite = tmp_path / "suite"
    records = tmp_path / "records"
    suite.mkdir()
    records.mkdir()
    (suite / "conftest.py").write_text('pytest_plugins = ["triton_dispatch.pytest_plugin"]\n')
    (suite / "test_records.py").write_text(_SUITE)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTEST_ADDOPTS")}
    env["RECORDS"] = str(records)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", str(suite)],
        cwd=suite, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = [json.loads(p.read_text()) for p in sorted(records.iterdir())]
    assert len(found) == 6
    return proc.stdout, found


def test_workers_take_the_seed_the_header_prints_and_share_the_cores(tmp_path):
    out, records = _run(tmp_path)
    header = re.search(r"random inputs --seed (\d+)", out)
    assert header, out[-2000:]
    assert all(r["worker"] and r["worker"].startswith("gw") for r in records)
    assert {r["session_seed"] for r in records} == {int(header.group(1))}
    assert {r["threads"] for r in records} == {max(1, (os.cpu_count() or 1) // 2)}
