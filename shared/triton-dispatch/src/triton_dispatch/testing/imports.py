"""Which modules of a package import each other: the packages' layering rule (kernels <- plan <-
declaration <- public function) says no two files do."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path


def module_imports(package: str) -> dict[str, set[str]]:
    """Each module of the installed ``package`` with the modules of the package it imports, at
    any level of the file (type-checking and function-level imports included), read from source."""
    root = Path(importlib.import_module(package).__file__).parent
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        name = ".".join([package, *parts])
        here = name if is_package else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = here
                for _ in range(max(node.level - 1, 0)):
                    base = base.rpartition(".")[0]
                module = (
                    node.module if node.level == 0 else ".".join(filter(None, [base, node.module]))
                )
                if module and module.split(".")[0] == package:
                    targets.add(module)
                    targets.update(f"{module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.split(".")[0] == package)
        graph[name] = targets
    return {m: {t for t in ts if t in graph and t != m} for m, ts in graph.items()}


def mutual_imports(package: str) -> list[tuple[str, str]]:
    """The pairs of modules of ``package`` that import each other, sorted. A package's
    ``__init__`` importing its own submodules (how it exports them) does not count."""
    graph = module_imports(package)
    return sorted(
        (a, b)
        for a, targets in graph.items()
        for b in targets
        if a < b and a in graph.get(b, ()) and not (b.startswith(a + ".") or a.startswith(b + "."))
    )
