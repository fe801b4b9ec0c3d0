"""The same measurements on two checkouts in one run, alternating, so that a refactor's "no worse
than before" is read off one machine: host time per call (``host_profile.py --root``) and the
``--quick`` rows of the benchmarks named (with ``--full``, their whole tables), each the best of
``--rounds`` alternating rounds.

    python3 tools/gpu/compare_checkouts.py --base ../baseline [--out DIR] [--rounds 2] [--full]

Each measurement runs in a fresh process with only that checkout's packages on ``PYTHONPATH``.
Writes ``compare_checkouts.json`` and prints the ratio new / base per row (below 1: faster now) of
the best round of each (a shared host slows whole processes by up to half: the best of several
fresh processes is what the code costs).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = [
    "packages/late-interaction-kernels/benchmarks/maxsim_training.py",
    "packages/late-interaction-kernels/benchmarks/maxsim_forward.py",
    "packages/vq-kernels/benchmarks/quantize.py",
    "packages/vq-kernels/benchmarks/rvq_step.py",
    "packages/tomo-kplanes/benchmarks/training_step.py",
]


def _env(tree: Path) -> dict[str, str]:
    paths = [
        tree / "shared" / "triton-dispatch" / "src",
        *sorted((tree / "packages").glob("*/src")),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    return env


def _run(cmd: list[str], tree: Path, timeout: int) -> bool:
    try:
        proc = subprocess.run(
            cmd, cwd=tree, env=_env(tree), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        print(f"timed out: {' '.join(cmd)}", flush=True)
        return False
    if proc.returncode:
        print(f"failed ({tree.name}): {' '.join(cmd)}\n{proc.stderr[-1500:]}", flush=True)
    return proc.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-results")))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--benchmarks", default=",".join(BENCHMARKS))
    parser.add_argument("--full", action="store_true", help="whole tables, not --quick rows")
    parser.add_argument("--skip-host", action="store_true", help="benchmarks only")
    args = parser.parse_args()
    trees = {"base": args.base.resolve(), "new": ROOT}
    host: dict[str, dict[str, list[float]]] = {"base": {}, "new": {}}
    bench: dict[str, dict[str, list[float]]] = {"base": {}, "new": {}}
    scratch = args.out / "compare"
    for rnd in range(0 if args.skip_host else args.rounds):
        for label, tree in trees.items():
            folder = scratch / f"{label}{rnd}"
            cmd = [sys.executable, str(ROOT / "tools/gpu/host_profile.py"), "--root", str(tree),
                   "--out", str(folder), "--calls", str(args.calls)]  # fmt: skip
            if _run(cmd, ROOT, 300):
                for row in json.loads((folder / "host_profile.json").read_text()):
                    host[label].setdefault(row["case"], []).append(row["wall_us"])
    # the benchmarks' quick rows are a few hundred microseconds of mostly host time: as noisy as
    # the host profile, so they take the best of as many alternating rounds
    scripts = [s for s in args.benchmarks.split(",") if s]
    for rnd, script, (label, tree) in itertools.product(range(args.rounds), scripts, trees.items()):
        target = scratch / f"{label}{rnd}" / (Path(script).stem + ".json")
        target.parent.mkdir(parents=True, exist_ok=True)
        size = [] if args.full else ["--quick"]
        if _run([sys.executable, script, *size, "--out", str(target)], tree, 400):
            data = json.loads(target.read_text())
            for rec in data.get("records", data if isinstance(data, list) else []):
                shape = ",".join(f"{k}={v}" for k, v in (rec.get("shape") or {}).items())
                key = f"{Path(script).stem}: {rec['name']} [{shape}]"
                bench[label].setdefault(key, []).append(rec["ours_ms"])
                print(f"{label}{rnd} {key[:100]:100s} {rec['ours_ms']:10.4f}", flush=True)
    rows = []
    for kind, table in (("host wall µs", host), ("benchmark ms", bench)):
        for key in table["new"]:
            if key in table["base"]:
                b, n = min(table["base"][key]), min(table["new"][key])
                rows.append({"kind": kind, "case": key, "base": b, "new": n, "ratio": n / b})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compare_checkouts.json").write_text(
        json.dumps({"rows": rows, "host": host, "bench": bench}, indent=1)
    )
    for r in rows:
        print(
            f"{r['kind']:13s} {r['case'][:100]:100s} {r['base']:10.3f} {r['new']:10.3f} {r['ratio']:6.2f}"
        )


if __name__ == "__main__":
    main()
