"""Multi-GPU runner: the ``multigpu`` tests over NCCL, then every distributed benchmark under
``torchrun`` on one and on two GPUs of this host, with results gathered into one JSON file.

    python3 tools/gpu/multi_gpu.py                        # everything, results in $OUT
    python3 tools/gpu/multi_gpu.py --only lik-sharded-speed-1 vq-ddp-1 vq-ddp-2 --skip-tests
    python3 tools/gpu/multi_gpu.py --only vq-ddp-2 lik-cross-rank-2 --skip-tests --profile

Writes ``multigpu.json`` (each job's exit status, seconds and the JSON its script wrote) and
``multigpu.log`` (every job's output), with the tests' ``pytest.log`` and ``pytest.xml``, to the
output folder, and prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distributed_jobs import JOBS, PROFILED
from harness import ROOT, device_line, environment, run_tests


def run_job(name: str, out: Path, env: dict[str, str], log, profile: bool = False) -> dict:
    script, nproc, extra, timeout = JOBS[name]
    if profile and script in PROFILED:
        extra = [*extra, "--profile"]
    part = out / f"{name}.json"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={nproc}", str(script), "--out", str(part), *extra,
    ]  # fmt: skip
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
        status, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        status = "timeout"
        text = "".join(
            s.decode() if isinstance(s, bytes) else (s or "") for s in (exc.stdout, exc.stderr)
        )
    seconds = round(time.perf_counter() - start, 1)
    log.write(f"=== {name} (exit {status}, {seconds} s)\n{text}\n")
    log.flush()
    print(f"--- {name}: exit {status}, {seconds} s\n{text[-2500:]}", flush=True)
    result = json.loads(part.read_text()) if part.is_file() else None
    part.unlink(missing_ok=True)
    return {"job": name, "processes": nproc, "exit": status, "seconds": seconds, "result": result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-results")))
    parser.add_argument("--only", nargs="*", choices=sorted(JOBS), help="jobs to run")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--profile", action="store_true", help="profile the steps that can be")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment()
    summary: dict = {"device": device_line(), "jobs": []}
    print(f"device: {summary['device']}", flush=True)
    with open(args.out / "multigpu.log", "w") as log:
        if not args.skip_tests:
            summary["tests"] = run_tests(args.out, env, ["-m", "multigpu"], 300)
            print(f"tests: {summary['tests']}", flush=True)
        for name in args.only or list(JOBS):
            summary["jobs"].append(run_job(name, args.out, env, log, args.profile))
            (args.out / "multigpu.json").write_text(json.dumps(summary, indent=2, default=str))
    print("\n== summary ==")
    if "tests" in summary:
        print(f"tests  {summary['tests']}")
    for job in summary["jobs"]:
        print(f"{job['job']:<22} exit={job['exit']} {job['seconds']} s")
    failed = summary.get("tests", {}).get("exit", 0) != 0 or any(
        j["exit"] != 0 for j in summary["jobs"]
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
