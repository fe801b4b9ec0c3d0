"""The tuning command: benchmark a package's config spaces on this GPU and write its table.

    python -m triton_dispatch.tune late_interaction_kernels               # the package's regimes
    python -m triton_dispatch.tune vq_kernels --shape 65536x1024x64x3 --out my-rtx4090.json

It switches autotuning on for the package (ignoring earlier results on disk, so every regime is
measured now), runs the package's ``warmup()`` on the shapes named (``--shape``, in that package's
notation; by default its ``TUNING_SHAPES``), and writes every regime's winner as a launch-config
table (:mod:`triton_dispatch.launch_configs`) that names the card (in the table and in each row),
its facts, the date, versions and command. Without ``--out`` it writes the package's own table
for this card, ``<package>/launch_configs/<slug>.json`` (:func:`~triton_dispatch.cards.slug_of`:
``h100.json`` on an H100, ``h200.json`` on an H200), its new rows merged into the rows already
there (a row of the same key replaced; ``--replace`` drops the old rows); review the diff like
code before shipping it.

The kernels key their regimes on a few of a call's sizes, so shapes of different sizes share a
regime (a one-query rerank over 1,000 documents and a 32 × 32 in-batch forward, say). By default
a regime's row is the winner on the first shape that reaches it. ``--robust`` benchmarks every
regime again on every shape that reaches it and keeps the config whose worst time over those
shapes is closest to each shape's own best (:func:`robust_choice`).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.resources
import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .autotune_mode import set_autotune, tuned_kernels
from .cards import card_of, describe_card
from .device import DeviceFacts, device_facts
from .launch_configs import TABLE_FOLDER, config_to_json, jsonable
from .tuning_cache import CACHE_ENV_VAR


def table_rows(package: str, card: str) -> dict[str, list[dict[str, Any]]]:
    """Rows of every regime the package's kernels tuned (or read from disk) in this process,
    each naming ``card``, the card they were measured on."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for kernel in tuned_kernels(package):
        for key, (config, ms) in kernel.tuned.items():
            row = {"key": {k: jsonable(v) for k, v in key}, "config": config_to_json(config)}
            if ms is not None:
                row["ms"] = round(float(ms), 5)
            row["card"] = card
            rows.setdefault(kernel.name, []).append(row)
    return rows


def robust_choice(timings: Sequence[Mapping[Any, float]]) -> tuple[Any, float, float] | None:
    """Of the configs timed on every shape of a regime (``timings``: ``{config: ms}`` per
    shape), the one whose largest ratio to a shape's fastest time is smallest (ties: the
    smaller sum of ratios): ``(config, its time on the first shape, that largest ratio)``;
    ``None`` when no config was timed on every shape."""
    if not timings:
        return None

    def ident(config) -> str:
        return json.dumps(config_to_json(config), sort_keys=True, default=str)

    per_shape = [{ident(c): (c, ms) for c, ms in t.items() if ms == ms and ms > 0} for t in timings]
    common = set(per_shape[0]).intersection(*per_shape[1:])
    if not common:
        return None
    best = [min(ms for _, ms in shape.values()) for shape in per_shape]

    def ratios(name: str) -> list[float]:
        return [shape[name][1] / fastest for shape, fastest in zip(per_shape, best)]

    name = min(sorted(common), key=lambda n: (max(ratios(n)), sum(ratios(n))))
    config, ms = per_shape[0][name]
    return config, ms, max(ratios(name))


def apply_robust_choices(package: str) -> list[str]:
    """Set each regime's row of the package's kernels to :func:`robust_choice` over the shapes
    that benchmarked it in this process (the first shape's winner where no config was timed on
    all of them); a line per regime that more than one shape reached."""
    lines = []
    for kernel in tuned_kernels(package):
        for key, timings in kernel.timings.items():
            choice = robust_choice(timings)
            if choice is None:
                config = min(timings[0], key=timings[0].get)
                choice = (config, timings[0][config], float("nan"))
            config, ms, worst = choice
            kernel.tuned[key] = (config, ms)
            if len(timings) > 1:
                lines.append(f"{kernel.name} {dict(key)}: {len(timings)} shapes, worst "
                             f"{worst:.3f}x their best with {config_to_json(config)}")  # fmt: skip
    return lines


def merge_rows(
    old: Mapping[str, list[Mapping[str, Any]]], new: Mapping[str, list[Mapping[str, Any]]]
) -> dict[str, list[dict[str, Any]]]:
    """``old`` with ``new``'s rows added, a new row replacing an old one of the same key; rows
    ordered by key so that diffs of a table stay readable."""
    merged: dict[str, dict[str, dict[str, Any]]] = {}
    for source in (old, new):
        for name, rows in source.items():
            for row in rows:
                merged.setdefault(name, {})[json.dumps(row["key"], sort_keys=True)] = dict(row)
    return {name: [rows[k] for k in sorted(rows)] for name, rows in sorted(merged.items())}


def _old_rows(path: Path) -> tuple[dict[str, Any], dict[str, list]]:
    """The header and rows of an existing table file; rows that do not name their card take the
    card (or, in an older family table, the device) its header names."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("kernels"), dict):
        raise ValueError(f"{path} is not a launch-config table (no 'kernels' mapping)")
    maker = data.get("card") or data.get("device")
    kernels = {
        name: [row if "card" in row or not maker else {**row, "card": maker} for row in rows]
        for name, rows in data["kernels"].items()
    }
    return data, kernels


def write_table(
    package: str,
    path: Path,
    *,
    command: str,
    merge: bool = True,
    device: int | None = None,
    facts: DeviceFacts | None = None,
) -> dict[str, Any]:
    """Write the package's tuned rows of this process to ``path`` (merged with the file's rows
    when ``merge``) as a table of the card it ran on; returns the table.

    The card is ``facts``' (by default the CUDA device ``device``'s, the current one when
    ``None``). Merged into a file of another card, the file keeps its ``card`` and the new rows
    name theirs."""
    import triton

    if facts is None:
        facts = device_facts(
            torch.device("cuda", device) if device is not None else None  # None: current device
        )
    card = card_of(facts)
    old_header: dict[str, Any] = {}
    old: dict[str, list] = {}
    if merge and path.is_file():
        old_header, old = _old_rows(path)
    same_card = old_header.get("card", facts.name) == facts.name
    table = {
        "card": facts.name if same_card else old_header["card"],
        "family": card.family if same_card else old_header.get("family", card.family),
        "card_facts": describe_card(card) if same_card else old_header.get("card_facts"),
        "date": datetime.date.today().isoformat(),
        "triton": triton.__version__,
        "torch": torch.__version__,
        "command": command,
        "kernels": merge_rows(old, table_rows(package, facts.name)),
    }
    if table["card_facts"] is None:
        del table["card_facts"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1) + "\n")
    return table


def default_table_path(package: str, slug: str) -> Path:
    """The package's own table for the card of ``slug`` (in its source tree or installed
    folder)."""
    return Path(str(importlib.resources.files(package))) / TABLE_FOLDER / f"{slug}.json"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m triton_dispatch.tune",
        description="Benchmark a package's kernel config spaces on this GPU and write its "
        "launch-config table.",
    )
    parser.add_argument("package", help="import name, e.g. late_interaction_kernels")
    parser.add_argument(
        "--shape",
        action="append",
        default=None,
        help="a shape regime in the package's warmup() notation (repeat; default: its "
        "TUNING_SHAPES)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="table file (default: the package's own for this card, launch_configs/<slug>.json)",
    )
    parser.add_argument("--replace", action="store_true", help="drop the rows already in --out")
    parser.add_argument(
        "--robust",
        action="store_true",
        help="benchmark each regime on every shape that reaches it; keep the config with the "
        "smallest worst slowdown over them",
    )
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        parser.error("tuning needs a CUDA GPU: it benchmarks each config on the device")
    os.environ[CACHE_ENV_VAR] = "0"  # measure every regime now, not from an earlier run's files
    set_autotune(True, args.package)
    try:
        module = importlib.import_module(f"{args.package}.warmup")
    except ModuleNotFoundError as exc:
        parser.error(f"{args.package} has no warmup module ({exc})")
    shapes = args.shape or list(module.TUNING_SHAPES)
    out = args.out or default_table_path(args.package, card_of(device_facts(None)).slug)
    command = "python -m triton_dispatch.tune " + shlex.join(sys.argv[1:] if argv is None else argv)
    merge = not args.replace
    lines: list[str] = []
    for shape in shapes:  # the table is rewritten after each shape: a cut-off run keeps its rows
        if args.robust:
            for kernel in tuned_kernels(args.package):
                kernel.forget_regimes()
        report = module.warmup([shape], device="cuda")
        if args.robust:  # every regime benchmarked so far, this shape's and earlier shapes'
            lines = apply_robust_choices(args.package)
        table = write_table(args.package, out, command=command, merge=merge)
        merge = True
        print(f"{shape}: {report.seconds:.1f} s, {report.compiled} kernels compiled", flush=True)
    for line in lines:  # the regimes more than one shape reached, once all have run
        print("  " + line)
    rows = sum(len(r) for r in table["kernels"].values())
    print(f"wrote {rows} rows for {len(table['kernels'])} kernels to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
