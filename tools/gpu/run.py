"""GPU runner: the whole test suite (``gpu``-marked tests included), then every package's
benchmarks, on a machine with CUDA and a plain ``python3`` that has torch and triton (no uv).

    python3 tools/gpu/run.py                   # tests + all benchmarks, results in $OUT or ./gpu-results
    python3 tools/gpu/run.py --only vq-kernels --skip-tests
    python3 tools/gpu/run.py --quick           # benchmarks with --quick (smoke)

Packages run from the source tree (``src/`` folders on ``PYTHONPATH``). Writes ``pytest.log``,
``pytest.xml``, ``benchmarks.json`` (every benchmark's records) and ``summary.json`` to the output
folder, and prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from distributed_jobs import DISTRIBUTED_SCRIPTS
from harness import ROOT, device_line, environment, run_tests


def benchmark_scripts(
    only: set[str] | None, scripts: set[str] | None = None
) -> list[tuple[str, Path]]:
    found = []
    folders = [ROOT / "shared" / "triton-dispatch", *sorted((ROOT / "packages").iterdir())]
    for pkg in folders:
        if only and pkg.name not in only:
            continue
        for script in (
            sorted((pkg / "benchmarks").glob("*.py")) if (pkg / "benchmarks").is_dir() else []
        ):
            if script in DISTRIBUTED_SCRIPTS or script.name.startswith("_"):
                continue
            if not scripts or script.stem in scripts:
                found.append((pkg.name, script))
    return found


def run_benchmarks(
    out: Path,
    env: dict[str, str],
    only: set[str] | None,
    scripts: set[str] | None,
    quick: bool,
    timeout: int,
) -> list[dict]:
    scratch = out / "bench-parts"
    scratch.mkdir(exist_ok=True)
    results = []
    for pkg, script in benchmark_scripts(only, scripts):
        part = scratch / f"{pkg}__{script.stem}.json"
        cmd = [sys.executable, str(script), "--out", str(part)] + (["--quick"] if quick else [])
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
            )
            status, text = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            status, text = "timeout", f"{exc.stdout or ''}{exc.stderr or ''}"
        print(f"--- {pkg}/{script.name} (exit {status}, {time.perf_counter() - start:.1f} s)")
        print(text[-6000:] if isinstance(text, str) else text)
        records = json.loads(part.read_text()) if part.is_file() else {"records": []}
        results.append(
            {
                "package": pkg,
                "script": script.name,
                "exit": status,
                "seconds": round(time.perf_counter() - start, 1),
                **records,
            }
        )
        part.unlink(missing_ok=True)
    scratch.rmdir()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-results")))
    parser.add_argument("--only", nargs="*", help="package folders to benchmark (and test)")
    parser.add_argument("--bench", nargs="*", help="benchmark script names (stems) to run")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    parser.add_argument("--test-timeout", type=int, default=300)
    parser.add_argument(
        "--bench-timeout", type=int, default=240, help="seconds per benchmark script"
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment()
    only = set(args.only) if args.only else None
    summary: dict = {"device": device_line()}
    print(f"device: {summary['device']}", flush=True)

    if not args.skip_tests:
        targets = args.pytest_args or (
            [str(ROOT / "packages" / p) for p in sorted(only)] if only else []
        )
        summary["tests"] = run_tests(args.out, env, targets, args.test_timeout)
        print(f"tests: {summary['tests']}", flush=True)
    if not args.skip_bench:
        bench = run_benchmarks(
            args.out,
            env,
            only,
            set(args.bench) if args.bench else None,
            args.quick,
            args.bench_timeout,
        )
        (args.out / "benchmarks.json").write_text(json.dumps(bench, indent=2, default=str))
        summary["benchmarks"] = [
            {k: b[k] for k in ("package", "script", "exit", "seconds")}
            | {"records": len(b.get("records", []))}
            for b in bench
        ]
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))

    print("\n== summary ==")
    print(f"device   {summary['device']}")
    if "tests" in summary:
        t = summary["tests"]
        print(f"tests    exit={t['exit']}  {t['seconds']} s  {t['result']}")
    for b in summary.get("benchmarks", []):
        print(
            f"bench    {b['package']}/{b['script']}: exit={b['exit']} records={b['records']} {b['seconds']} s"
        )
    failed = ("tests" in summary and summary["tests"]["exit"] != 0) or any(
        b["exit"] != 0 for b in summary.get("benchmarks", [])
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
