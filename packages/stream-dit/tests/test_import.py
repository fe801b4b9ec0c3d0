from pathlib import Path

import stream_dit


def test_package_imports_with_a_version() -> None:
    # "0.0.0" when imported from a source tree that is not installed (the GPU runner does that)
    assert isinstance(stream_dit.__version__, str) and stream_dit.__version__


def _module_imports(root: Path, package: str) -> dict[str, set[str]]:
    """Each module of ``package`` (files under ``root``) with the package modules it imports,
    at any level of the file (type-checking and function-level imports included)."""
    import ast

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


def test_no_two_modules_import_each_other():
    """Imports run one way: no module imports a module that imports it back (a package's
    ``__init__`` importing its own submodules is the one exception: that is how it exports)."""
    import stream_dit

    root = Path(stream_dit.__file__).parent
    graph = _module_imports(root, "stream_dit")
    pairs = sorted(
        (a, b)
        for a, targets in graph.items()
        for b in targets
        if a < b and a in graph.get(b, ()) and not (b.startswith(a + ".") or a.startswith(b + "."))
    )
    assert pairs == []
