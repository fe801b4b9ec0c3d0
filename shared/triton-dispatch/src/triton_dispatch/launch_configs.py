"""Launch-config tables shipped inside kernel packages, and the nearest-row lookup over them.

A table is a JSON file ``<package>/launch_configs/<family>.json`` (``sm90`` for H100/H200, ``sm80``
for A100, ...) written by ``python -m triton_dispatch.tune``. It says what made it (device, date,
versions, command) and, per kernel, rows of a shape-regime key and the config the tuning run picked
for it::

    {"family": "sm90", "device": "NVIDIA H100 80GB HBM3", "date": "2026-11-25",
     "triton": "3.6.0", "torch": "2.11.0+cu130", "command": "python -m triton_dispatch.tune ...",
     "kernels": {"maxsim_fwd_kernel": [
         {"key": {"LQ_BUCKET": 32, "BLOCK_K": 128, ..., "Q": "torch.bfloat16"},
          "config": {"kwargs": {"BLOCK_Q": 32, ...}, "num_warps": 4, "num_stages": 3},
          "ms": 0.0123}]}}

A key that has no row takes the row whose key is nearest (the same flags and dtypes, the closest
sizes on a log scale), so a regime between two tuned ones gets a neighbour's config, not a default.
A card whose family has no table takes the rows of the nearest card's table
(:func:`tables_by_nearness`); the runtime guard (:mod:`triton_dispatch.shared_memory`) passes
over the rows whose kernels do not fit its shared memory.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch

#: The folder inside a package that holds its tables.
TABLE_FOLDER = "launch_configs"

# Mismatch costs of the nearest-row search: one power of two of size is 1; a different flag or
# dtype costs more than any plausible size distance, so a row with the same flags always wins.
_FLAG_MISMATCH = 16.0


def device_family(capability: tuple[int, int]) -> str:
    """The table family of a CUDA compute capability: ``(9, 0)`` → ``"sm90"``."""
    major, minor = capability
    return f"sm{major}{minor}"


def family_capability(family: str) -> tuple[int, int] | None:
    """The compute capability of a table family: ``"sm90"`` → ``(9, 0)``, ``"sm120"`` →
    ``(12, 0)``; ``None`` for a name of another form."""
    digits = family.removeprefix("sm")
    if family == digits or len(digits) < 2 or not digits.isdigit():
        return None
    return int(digits[:-1]), int(digits[-1])


def config_to_json(config) -> dict[str, Any]:
    """A ``triton.Config`` as the JSON object tables and caches store."""
    out: dict[str, Any] = {
        "kwargs": dict(config.kwargs),
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
    }
    if getattr(config, "num_ctas", 1) not in (None, 1):
        out["num_ctas"] = config.num_ctas
    if getattr(config, "maxnreg", None) is not None:
        out["maxnreg"] = config.maxnreg
    return out


def config_from_json(data: Mapping[str, Any]):
    """The ``triton.Config`` of a stored JSON object (``ValueError`` when it is not one)."""
    import triton

    if not isinstance(data, Mapping) or not isinstance(data.get("kwargs"), Mapping):
        raise ValueError(f"not a stored config: {data!r}")
    return triton.Config(
        dict(data["kwargs"]),
        num_warps=int(data.get("num_warps", 4)),
        num_stages=int(data.get("num_stages", 2)),
        num_ctas=int(data.get("num_ctas", 1)),
        maxnreg=data.get("maxnreg"),
    )


def same_config(a, b) -> bool:
    """Whether two configs launch the same kernel (kwargs, warps, stages, CTAs, register cap)."""
    return a.all_kwargs() == b.all_kwargs()


def jsonable(value: Any) -> Any:
    """A key value as JSON stores it (dtypes by name, tuples as lists)."""
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    return repr(value)


def key_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """How far two regime keys are: ``|log2 x - log2 y|`` summed over positive integer sizes,
    :data:`_FLAG_MISMATCH` per other field that differs; ``inf`` when the fields differ."""
    if a.keys() != b.keys():
        return math.inf
    total = 0.0
    for name, x in a.items():
        y = b[name]
        if x == y and type(x) is type(y):
            continue
        sizes = all(type(v) is int and v > 0 for v in (x, y))
        total += abs(math.log2(x) - math.log2(y)) if sizes else _FLAG_MISMATCH
    return total


def nearest_rows(rows: Iterable[Mapping[str, Any]], key: Mapping[str, Any]) -> list[Mapping]:
    """Table rows ordered from the nearest key to ``key`` (rows with other key fields left out)."""
    scored = [(key_distance(key, row.get("key", {})), i, row) for i, row in enumerate(rows)]
    return [row for d, _, row in sorted(scored, key=lambda s: (s[0], s[1])) if d != math.inf]


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def validate_table(data: Any, origin: str) -> dict[str, list[Mapping[str, Any]]]:
    """The ``kernels`` mapping of a loaded table, or ``{}`` with a warning when it is malformed."""
    kernels = data.get("kernels") if isinstance(data, Mapping) else None
    if not isinstance(kernels, Mapping) or not all(
        isinstance(rows, list) and all(isinstance(r, Mapping) for r in rows)
        for rows in kernels.values()
    ):
        _warn(f"ignoring launch-config table {origin}: no 'kernels' mapping of row lists")
        return {}
    return {str(name): list(rows) for name, rows in kernels.items()}


@functools.cache
def package_table(package: str, family: str) -> dict[str, list[Mapping[str, Any]]]:
    """The rows per kernel of ``package``'s shipped table for ``family`` (``{}`` when there is
    none). A malformed file is ignored with a warning."""
    try:
        resource = importlib.resources.files(package) / TABLE_FOLDER / f"{family}.json"
        if not resource.is_file():
            return {}
        text = resource.read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError, TypeError):
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        _warn(f"ignoring launch-config table {package}/{TABLE_FOLDER}/{family}.json: {exc}")
        return {}
    return validate_table(data, f"{package}/{TABLE_FOLDER}/{family}.json")


@functools.cache
def table_families(package: str) -> tuple[str, ...]:
    """The families ``package`` ships tables for (its table files' stems)."""
    try:
        folder = importlib.resources.files(package) / TABLE_FOLDER
        files = [f for f in folder.iterdir() if f.name.endswith(".json")] if folder.is_dir() else []
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError, TypeError):
        return ()
    return tuple(sorted(f.name[: -len(".json")] for f in files))


def shipped_tables(package: str) -> dict[str, dict[str, list[Mapping[str, Any]]]]:
    """Every table ``package`` ships, by family (file stem)."""
    return {family: package_table(package, family) for family in table_families(package)}


def tables_by_nearness(
    package: str, capability: tuple[int, int]
) -> list[tuple[str, dict[str, list[Mapping[str, Any]]]]]:
    """``(family, table)`` of ``package``'s tables that a device of ``capability`` reads, in
    order: its own family's, then the other cards' tables, nearest card first (the same major
    version first, then the closest compute capability, the older card on a tie). A card
    without a table of its own so takes the nearest known card's rows."""
    from .gpu_targets import TARGETS

    own = device_family(capability)
    families = {device_family(t.compute_capability) for t in TARGETS}
    families.update(table_families(package))
    number = capability[0] * 10 + capability[1]

    def distance(family: str) -> tuple:
        major, minor = family_capability(family) or (0, 0)
        return (major != capability[0], abs(major * 10 + minor - number), major * 10 + minor)

    others = sorted((f for f in families - {own} if family_capability(f)), key=distance)
    tables = [(family, package_table(package, family)) for family in (own, *others)]
    return [(family, table) for family, table in tables if table]


def import_kernel_modules(package: str) -> None:
    """Import every module of ``package`` that the package itself can import (optional
    integrations whose libraries are missing are passed over), so that all its tuned kernels
    are declared."""
    import importlib
    import pkgutil

    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        try:
            importlib.import_module(info.name)
        except ImportError:
            continue


def check_package_tables(package: str) -> list[str]:
    """What is wrong with ``package``'s shipped tables against its kernels (empty when nothing):
    two tuned kernels of one name, rows of an unknown kernel, key fields the kernel does not key
    on, configs outside the kernel's space."""
    from .autotune_mode import tuned_kernels

    import_kernel_modules(package)
    kernels = tuned_kernels(package)
    problems = []
    names = [k.name for k in kernels]
    problems += [
        f"two tuned kernels named {n}" for n in sorted({n for n in names if names.count(n) > 1})
    ]
    by_name = {k.name: k for k in kernels}
    for family, table in shipped_tables(package).items():
        for name, rows in table.items():
            kernel = by_name.get(name)
            if kernel is None:
                problems.append(f"{family}: rows for an unknown kernel {name}")
                continue
            allowed = set(kernel.keys) | set(kernel.arg_names)
            for row in rows:
                extra = set(row.get("key", {})) - allowed
                if extra:
                    problems.append(
                        f"{family}/{name}: key fields {sorted(extra)} not in the kernel"
                    )
                try:
                    config = config_from_json(row.get("config"))
                except ValueError as exc:
                    problems.append(f"{family}/{name}: {exc}")
                    continue
                if not any(same_config(config, c) for c in kernel.space):
                    problems.append(f"{family}/{name}: {config} is not in the kernel's space")
    return problems


__all__ = [
    "TABLE_FOLDER",
    "check_package_tables",
    "config_from_json",
    "config_to_json",
    "device_family",
    "family_capability",
    "import_kernel_modules",
    "jsonable",
    "key_distance",
    "nearest_rows",
    "package_table",
    "same_config",
    "shipped_tables",
    "table_families",
    "tables_by_nearness",
    "validate_table",
]
