"""What the GPU runners share: the source tree's paths on ``PYTHONPATH``, the environment their
children run in, one pytest run with its log and JUnit XML, and the line naming the device."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def source_paths() -> list[Path]:
    paths = [ROOT / "shared" / "triton-dispatch" / "src", ROOT / "tools" / "src"]
    paths += sorted(p / "src" for p in (ROOT / "packages").iterdir() if (p / "src").is_dir())
    return paths


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # real kernels on the GPU
    extra = os.pathsep.join(str(p) for p in source_paths())
    env["PYTHONPATH"] = extra + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_tests(out: Path, env: dict[str, str], pytest_args: list[str], timeout: int) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-rfEs",
        "-p",
        "no:cacheprovider",
        f"--junitxml={out / 'pytest.xml'}",
        *pytest_args,
    ]
    start = time.perf_counter()
    with open(out / "pytest.log", "w") as log:
        try:
            proc = subprocess.run(
                cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout
            )
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    tail = (out / "pytest.log").read_text().strip().splitlines()[-1:] or [""]
    return {"exit": code, "seconds": round(time.perf_counter() - start, 1), "result": tail[0]}


def device_line() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            import triton

            return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, triton {triton.__version__}"
        return f"no CUDA device, torch {torch.__version__}"
    except Exception as exc:
        return f"torch unavailable: {exc}"
