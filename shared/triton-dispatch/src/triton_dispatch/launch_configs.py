"""Launch-config tables shipped inside kernel packages, one per card: their format and loading.

A table is a JSON file ``<package>/launch_configs/<card slug>.json`` (``h100.json``, ``h200.json``;
:mod:`triton_dispatch.cards` names the slugs) written by ``python -m triton_dispatch.tune`` on that
card. It names the card that made it, its compute-capability family and the card's facts (so a
card the registry does not know can still be ranked), what made it (date, versions, command) and,
per kernel, rows of a shape-regime key and the config the tuning run picked for it, each row
naming the card it was measured on::

    {"card": "NVIDIA H100 80GB HBM3", "family": "sm90",
     "card_facts": {"capability": [9, 0], "memory_bandwidth_gbs": 3350,
                    "sm_count": 132, "shared_memory_per_block": 232448},
     "date": "2026-11-25", "triton": "3.6.0", "torch": "2.11.0+cu130",
     "command": "python -m triton_dispatch.tune ...",
     "kernels": {"maxsim_fwd_kernel": [
         {"key": {"LQ_BUCKET": 32, "BLOCK_K": 128, ..., "Q": "torch.bfloat16"},
          "config": {"kwargs": {"BLOCK_Q": 32, ...}, "num_warps": 4, "num_stages": 3},
          "ms": 0.0123, "card": "NVIDIA H100 80GB HBM3"}]}}

A row may carry a free-text ``note`` (how a row measured outside the tuning command was made).
:func:`table_problems` holds a file to this format. Older tables named by family (``sm90.json``,
no ``card``) are still read: their rows count as every card of that family's own. Which rows a
running card reads, and in what order, is :mod:`triton_dispatch.table_rows`.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import math
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .cards import Card, card_by_slug, card_from_description, slug_of

#: The folder inside a package that holds its tables.
TABLE_FOLDER = "launch_configs"

# Mismatch costs of the nearest-row search: one power of two of size is 1; a different flag or
# dtype costs more than any plausible size distance, so a row with the same flags always wins.
_FLAG_MISMATCH = 16.0

_FAMILY_NAME = re.compile(r"sm\d{2,3}")


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


def is_family_name(name: str) -> bool:
    """Whether a table stem names a compute-capability family (``sm90``: an older table)."""
    return bool(_FAMILY_NAME.fullmatch(name))


@dataclass(frozen=True)
class LaunchTable:
    """One table file of a package.

    Attributes:
        name: the file's stem: a card slug (``"h100"``), or a family (``"sm90"``) in older tables.
        card: the card that made it (``None`` for an older family table, whose rows stand for
            every card of :attr:`family`).
        family: the compute-capability family of its card (``"sm90"``).
        kernels: its rows per kernel name.
        header: everything else the file records (card, date, versions, command).
    """

    name: str
    card: Card | None
    family: str
    kernels: Mapping[str, list[Mapping[str, Any]]]
    header: Mapping[str, Any] = field(default_factory=dict)

    def row_card(self, row: Mapping[str, Any]) -> Card | None:
        """The card that measured ``row``: its own ``card`` field, else the table's (``None`` for
        a row of an older family table)."""
        name = row.get("card")
        if not isinstance(name, str) or not name:
            return self.card
        if self.card is not None and name == self.card.name:
            return self.card
        return _named_card(name, family_capability(self.family))


@functools.cache
def _named_card(name: str, capability: tuple[int, int] | None) -> Card:
    return card_from_description(name, capability=capability)


def _kernels(data: Any) -> dict[str, list[Mapping[str, Any]]] | None:
    kernels = data.get("kernels") if isinstance(data, Mapping) else None
    if not isinstance(kernels, Mapping) or not all(
        isinstance(rows, list) and all(isinstance(r, Mapping) for r in rows)
        for rows in kernels.values()
    ):
        return None
    return {str(name): list(rows) for name, rows in kernels.items()}


def validate_table(data: Any, origin: str) -> dict[str, list[Mapping[str, Any]]]:
    """The ``kernels`` mapping of a loaded table, or ``{}`` with a warning when it is malformed."""
    kernels = _kernels(data)
    if kernels is None:
        _warn(f"ignoring launch-config table {origin}: no 'kernels' mapping of row lists")
        return {}
    return kernels


def parse_table(data: Any, name: str, origin: str | None = None) -> LaunchTable | None:
    """The :class:`LaunchTable` of a file's JSON ``data`` whose stem is ``name``; ``None`` with a
    warning when it cannot be read as one. Lenient where the meaning is clear: a card table
    without ``card`` takes the card its stem names. :func:`table_problems` is the strict check."""
    origin = origin or f"{name}.json"
    kernels = validate_table(data, origin)
    if not kernels:
        return None
    header = {k: v for k, v in data.items() if k != "kernels"}
    card_name, family = header.get("card"), header.get("family")
    if isinstance(card_name, str) and card_name:
        stated = family_capability(family) if isinstance(family, str) else None
        try:
            card = card_from_description(card_name, header.get("card_facts"), capability=stated)
        except ValueError as exc:
            _warn(f"ignoring launch-config table {origin}: {exc}")
            return None
        return LaunchTable(name, card, card.family, kernels, header)
    if is_family_name(name):
        return LaunchTable(name, None, name, kernels, header)
    card = card_by_slug(name)
    if card is None:
        _warn(f"ignoring launch-config table {origin}: it names no card and {name!r} is no "
              "known card's slug")  # fmt: skip
        return None
    return LaunchTable(name, card, card.family, kernels, header)


def _row_problems(row: Mapping[str, Any], where: str) -> list[str]:
    problems = []
    if not isinstance(row.get("key"), Mapping):
        problems.append(f"{where}: no 'key' mapping")
    try:
        config_from_json(row.get("config"))
    except ValueError as exc:
        problems.append(f"{where}: {exc}")
    if not isinstance(row.get("card"), str) or not row["card"]:
        problems.append(f"{where}: no 'card' naming the GPU that measured it")
    ms = row.get("ms")
    if ms is not None and (isinstance(ms, bool) or not isinstance(ms, (int, float))):
        problems.append(f"{where}: 'ms' is {ms!r}, not a number")
    return problems


def table_problems(data: Any, name: str) -> list[str]:
    """What keeps the JSON ``data`` of table file ``<name>.json`` from the format of this module
    (empty when nothing): a family name or no ``card`` (rows must say which card made them), a
    stem that is not its card's slug, a ``family`` that is not its card's, ``card_facts``
    missing for a card the registry does not know, rows without a key, a config or a card."""
    origin = f"{name}.json"
    if _kernels(data) is None:
        return [f"{origin}: no 'kernels' mapping of row lists"]
    if is_family_name(name) or not isinstance(data.get("card"), str) or not data["card"]:
        return [f"{origin}: a table names the card that made it ('card') and is named by its "
                f"slug (python -m triton_dispatch.tune writes <slug>.json)"]  # fmt: skip
    problems = []
    card_name, facts = data["card"], data.get("card_facts")
    if slug_of(card_name) != name:
        problems.append(
            f"{origin}: made on {card_name!r}, so its name is {slug_of(card_name)}.json"
        )
    family = data.get("family")
    stated = family_capability(family) if isinstance(family, str) else None
    try:
        card = card_from_description(card_name, facts, capability=stated)
    except ValueError as exc:
        return [*problems, f"{origin}: {exc}"]
    if facts is None and card.pattern is None:
        problems.append(f"{origin}: {card_name!r} is not a known card: record its 'card_facts'")
    elif family != card.family:
        problems.append(f"{origin}: 'family' is {family!r}; {card_name} is {card.family}")
    for kernel, rows in data["kernels"].items():
        for i, row in enumerate(rows):
            problems += _row_problems(row, f"{origin}: {kernel} row {i}")
    return problems


def _read_json(package: str, name: str) -> tuple[Any, str] | None:
    """The parsed JSON of ``package``'s table ``name`` and its origin, ``None`` when there is no
    such file; a file that is not JSON is ignored with a warning."""
    origin = f"{package}/{TABLE_FOLDER}/{name}.json"
    try:
        resource = importlib.resources.files(package) / TABLE_FOLDER / f"{name}.json"
        if not resource.is_file():
            return None
        text = resource.read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError, TypeError):
        return None
    try:
        return json.loads(text), origin
    except ValueError as exc:
        _warn(f"ignoring launch-config table {origin}: {exc}")
        return None


@functools.cache
def load_table(package: str, name: str) -> LaunchTable | None:
    """``package``'s shipped table ``<name>.json`` (``None`` when there is none; a malformed file
    is ignored with a warning)."""
    read = _read_json(package, name)
    return parse_table(read[0], name, read[1]) if read is not None else None


@functools.cache
def table_names(package: str) -> tuple[str, ...]:
    """The stems of the tables ``package`` ships (card slugs; families in older packages)."""
    try:
        folder = importlib.resources.files(package) / TABLE_FOLDER
        files = [f for f in folder.iterdir() if f.name.endswith(".json")] if folder.is_dir() else []
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError, TypeError):
        return ()
    return tuple(sorted(f.name[: -len(".json")] for f in files))


def package_tables(package: str) -> list[LaunchTable]:
    """Every table ``package`` ships that could be read, by stem."""
    tables = (load_table(package, name) for name in table_names(package))
    return [table for table in tables if table is not None]


def shipped_tables(package: str) -> dict[str, dict[str, list[Mapping[str, Any]]]]:
    """Every table ``package`` ships, its rows per kernel by stem."""
    return {table.name: dict(table.kernels) for table in package_tables(package)}


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
    """What is wrong with ``package``'s shipped tables against this module's format
    (:func:`table_problems`) and its kernels (empty when nothing): two tuned kernels of one
    name, rows of an unknown kernel, key fields the kernel does not key on, configs outside the
    kernel's space."""
    from .autotune_mode import tuned_kernels

    import_kernel_modules(package)
    kernels = tuned_kernels(package)
    problems = []
    names = [k.name for k in kernels]
    problems += [
        f"two tuned kernels named {n}" for n in sorted({n for n in names if names.count(n) > 1})
    ]
    for name in table_names(package):
        read = _read_json(package, name)
        problems += (
            table_problems(read[0], name) if read is not None else [f"{name}.json: not JSON"]
        )
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
    "LaunchTable",
    "check_package_tables",
    "config_from_json",
    "config_to_json",
    "device_family",
    "family_capability",
    "import_kernel_modules",
    "is_family_name",
    "jsonable",
    "key_distance",
    "load_table",
    "nearest_rows",
    "package_tables",
    "parse_table",
    "same_config",
    "shipped_tables",
    "table_names",
    "table_problems",
    "validate_table",
]
