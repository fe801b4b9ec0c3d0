"""The exhaustive shared-memory check of every package's tuned kernels, on a machine with many CPU
cores (it needs no GPU: the compiles run on the CPU, one per core).

    TRITON_INTERPRET=1 PYTHONPATH=shared/triton-dispatch/src:packages/late-interaction-kernels/src:\
packages/vq-kernels/src:packages/tomo-kplanes/src python3 tools/gpu/target_fit.py --out results.json

For each package it runs ``target_check.check_targets(..., exhaustive=True)`` with the warm-up of
the package's ``tests/test_launch_tables.py``: every config the runtime may launch for every regime
(first choices and every fallback), compiled whole for each of sm_80, sm_86, sm_89, sm_90, sm_100
and sm_120. It prints, per package and target, how many configs fit, the largest first choice and
the configs that do not fit, then the failures (compile errors, first choices that do not fit,
targets of one mma group that disagree), and writes every measurement as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "late_interaction_kernels": "late-interaction-kernels",
    "vq_kernels": "vq-kernels",
    "tomo_kplanes": "tomo-kplanes",
}


def _warm_of(folder: str):
    path = ROOT / "packages" / folder / "tests" / "test_launch_tables.py"
    spec = importlib.util.spec_from_file_location(f"{folder}_launch_tables", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._warm


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="JSON of every measurement")
    parser.add_argument("--package", action="append", choices=sorted(PACKAGES), default=None)
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("set TRITON_INTERPRET=1: the warm-ups record interpreted launches")
    from triton_dispatch.target_check import check_targets

    records, failed = [], []
    for package in args.package or list(PACKAGES):
        start = time.perf_counter()
        failures, measured = check_targets(package, _warm_of(PACKAGES[package]), exhaustive=True)
        seconds = time.perf_counter() - start
        print(f"{package}: {len(measured)} compiles in {seconds:.0f} s on {os.cpu_count()} cores")
        for plan, use in measured:
            records.append({
                "package": package, "kernel": plan.kernel, "target": plan.target.name,
                "card": plan.card.slug if plan.card is not None else None,
                "limit": plan.target.shared_memory_per_block, "rank": plan.rank,
                "source": plan.source, "config": str(plan.config), "key": plan.key,
                "shared": use.shared, "error": use.error,
            })  # fmt: skip
        for target in sorted({p.target.name for p, _ in measured}):
            here = [(p, u) for p, u in measured if p.target.name == target and u.shared is not None]
            first = max((u.shared for p, u in here if p.rank == 0), default=0)
            misfits = [(p, u) for p, u in here if not u.fits]
            print(f"  {target}: {len(here) - len(misfits)}/{len(here)} fit, largest first choice "
                  f"{first} bytes, {len(misfits)} fallbacks the guard passes over")  # fmt: skip
        failed += [f"{package}: {f}" for f in failures]
    if args.out:
        args.out.write_text(json.dumps(records, indent=0))
    print("\n".join(f[:2000] for f in failed) or "no failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "shared" / "triton-dispatch" / "src"))
    raise SystemExit(main())
