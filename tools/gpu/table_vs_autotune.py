"""Warm speed with shipped launch-config tables against autotuning: each benchmark script runs
twice, each time in its own process, once with the tables alone (the first-call short tune of a
card without rows of its own off, ``TRITON_DISPATCH_BOUNDED_TUNE=0``, and nothing read from the
tuning cache) and once with ``TRITON_DISPATCH_AUTOTUNE=1`` (every regime benchmarks its config
space on its first call), and the ``ours`` column of each case is compared (GPU median of
``do_bench`` and wall time per call). ``--bounded`` adds a third run with the short tune on and
an empty tuning cache (what a card without a table of its own gets on its first calls). A script
with a row more than ``--threshold`` slower with the table runs again in both modes
(``--rechecks`` rounds, unless both runs launched the same configs), and each mode keeps its
faster time of each case. Each row says
whether the script's tuned kernels took the same config for every regime in both runs
(``same_configs``; the regimes that differ are listed per script): a gap between runs that
launched the same kernels is the processes', not the table's.

    python3 tools/gpu/table_vs_autotune.py --out table_vs_autotune.json \\
        packages/vq-kernels/benchmarks/quantize.py packages/tomo-kplanes/benchmarks/training_step.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


MODES = ("table", "autotuned", "bounded")


def run(script: Path, mode: str, out: Path, timeout: int) -> list[dict]:
    """The records of one run of ``script`` with configs from ``mode`` (one of :data:`MODES`);
    the run's tuned choices (``triton_dispatch.bench.tuned_choices``) are left in
    ``out``'s JSON (:func:`choices`)."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env.pop("TRITON_DISPATCH_AUTOTUNE", None)
    env["TRITON_DISPATCH_TUNING_CACHE"] = "0"  # tune now, not from an earlier run's files
    env["TRITON_DISPATCH_BOUNDED_TUNE"] = "0"
    env["TRITON_DISPATCH_BENCH_BASELINES"] = "0"  # only our own times are compared
    # the kernels' time (a graph of one call, L2 flushed), not the host's launches
    env.setdefault("TRITON_DISPATCH_BENCH_GRAPHS", "1")
    if mode == "autotuned":
        env["TRITON_DISPATCH_AUTOTUNE"] = "1"
    elif mode == "bounded":  # an empty cache of its own: the short tune runs and keeps its picks
        env["TRITON_DISPATCH_BOUNDED_TUNE"] = "1"
        env["TRITON_DISPATCH_TUNING_CACHE"] = "1"
        env["TRITON_DISPATCH_CACHE_DIR"] = str(out.parent / "bounded-cache")
    proc = subprocess.run(
        [sys.executable, str(script), "--out", str(out)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"{script} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(out.read_text())["records"]


def choices(out: Path) -> dict[str, dict[str, str]]:
    """The tuned kernels' config per regime that the run writing ``out`` took."""
    return json.loads(out.read_text()).get("choices", {})


def differing_choices(table: dict, tuned: dict) -> list[str]:
    """``kernel regime`` of every regime both runs met and configured differently: none means
    both runs launched the same kernels, and a time that differs is the processes', not the
    table's."""
    return [
        f"{kernel} {regime}"
        for kernel, picks in table.items()
        for regime, config in picks.items()
        if regime in tuned.get(kernel, {}) and tuned[kernel][regime] != config
    ]


def _case(record: dict) -> str:
    """A case's identity: its name and its shape (several cases share a name)."""
    return record["name"] + " " + json.dumps(record["shape"], sort_keys=True, default=str)


def _worst_ratio(table: list[dict], tuned: list[dict]) -> float:
    """The largest table / autotuned GPU-time ratio over the cases both runs timed."""
    by_case = {_case(r): r for r in tuned}
    ratios = [r["ours_ms"] / by_case[_case(r)]["ours_ms"] for r in table
              if _case(r) in by_case and r["ours_ms"] and by_case[_case(r)]["ours_ms"]]  # fmt: skip
    return max(ratios, default=0.0)


def _faster(first: list[dict], second: list[dict]) -> list[dict]:
    """Per case, the record of the two runs with the shorter GPU time."""
    again = {_case(r): r for r in second}
    merged = []
    for r in first:
        other = again.get(_case(r))
        if other and other["ours_ms"] and (not r["ours_ms"] or other["ours_ms"] < r["ours_ms"]):
            r = other
        merged.append(r)
    return merged


def _write(out: Path, rows: list, errors: list, differs: dict) -> None:
    out.write_text(
        json.dumps({"rows": rows, "errors": errors, "differing_choices": differs}, indent=1)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scripts", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("table_vs_autotune.json"))
    parser.add_argument("--timeout", type=int, default=300)
    parser.add_argument("--bounded", action="store_true", help="add a run with the short tune")
    parser.add_argument(
        "--threshold", type=float, default=1.03, help="table / autotuned to recheck"
    )
    parser.add_argument("--rechecks", type=int, default=1,
                        help="extra rounds of both runs for a script with a row above --threshold")  # fmt: skip
    args = parser.parse_args()
    rows, errors = [], []
    differs: dict[str, list[str]] = {}  # per script: the regimes configured differently
    with tempfile.TemporaryDirectory() as tmp:
        for script in args.scripts:
            start = time.perf_counter()
            try:
                table = run(script, "table", Path(tmp) / "table.json", args.timeout)
                tuned = run(script, "autotuned", Path(tmp) / "tuned.json", args.timeout)
                differ = differing_choices(
                    choices(Path(tmp) / "table.json"), choices(Path(tmp) / "tuned.json")
                )
                differs[script.name] = differ
                for _ in range(args.rechecks):
                    if not differ or _worst_ratio(table, tuned) <= args.threshold:
                        break  # the same configs launched: nothing of the table's to recheck
                    # a second process of each: a row's time moves between processes (clocks, the
                    # host), so each mode keeps its faster run of the case
                    table = _faster(
                        table, run(script, "table", Path(tmp) / "t2.json", args.timeout)
                    )
                    tuned = _faster(
                        tuned, run(script, "autotuned", Path(tmp) / "a2.json", args.timeout)
                    )
                bounded = (run(script, "bounded", Path(tmp) / "bounded.json", args.timeout)
                           if args.bounded else [])  # fmt: skip
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                errors.append({"script": str(script), "error": str(error)[-3000:]})
                continue
            by_case = {_case(r): r for r in tuned}
            bounded_by_case = {_case(r): r for r in bounded}
            for r in table:
                t = by_case.get(_case(r))
                if t is None or not r["ours_ms"] or not t["ours_ms"]:
                    continue
                b = bounded_by_case.get(_case(r), {})
                rows.append({
                    "script": script.name, "case": r["name"], "shape": r["shape"],
                    "table_ms": r["ours_ms"], "autotuned_ms": t["ours_ms"],
                    "table_wall_ms": r.get("ours_wall_ms"), "autotuned_wall_ms": t.get("ours_wall_ms"),
                    "table_over_autotuned": r["ours_ms"] / t["ours_ms"],
                    "bounded_ms": b.get("ours_ms"),
                    # the script's tuned regimes all took the same config in both runs
                    "same_configs": not differ,
                })  # fmt: skip
            print(f"{script.name}: {time.perf_counter() - start:.0f} s", flush=True)
            # after every script, so a run cut short keeps what it measured
            _write(args.out, rows, errors, differs)
    _write(args.out, rows, errors, differs)
    print("| script | case | table ms | autotuned ms | table / autotuned | wall: table, autotuned "
          "| short tune ms | configs |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        walls = ", ".join(
            f"{w:.3f}" if w else "-" for w in (r["table_wall_ms"], r["autotuned_wall_ms"])
        )
        shape = ", ".join(f"{k}={v}" for k, v in r["shape"].items())
        short = f"{r['bounded_ms']:.4f}" if r["bounded_ms"] else "-"
        print(f"| {r['script']} | {r['case']} ({shape}) | {r['table_ms']:.4f} | {r['autotuned_ms']:.4f} | "
              f"{r['table_over_autotuned']:.3f} | {walls} | {short} | "
              f"{'same' if r['same_configs'] else 'differ'} |")  # fmt: skip
    for name, differ in differs.items():
        if differ:
            print(f"{name}: {len(differ)} regimes configured differently, e.g. {differ[0]}")
    for e in errors:
        print(f"ERROR {e['script']}: {e['error'][-600:]}")


if __name__ == "__main__":
    main()
