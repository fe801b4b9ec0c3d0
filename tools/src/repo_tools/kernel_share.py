"""How much of each package's ``ops/`` code is Triton kernels: lines of ``@triton.jit`` functions
(decorators included) over all lines of ``packages/*/src/*/ops/**/*.py``.

    python3 -m repo_tools.kernel_share [ROOT]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def kernel_lines(source: str) -> int:
    """Lines of the ``@triton.jit``-decorated functions in ``source``."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and any(
            "jit" in ast.unparse(d) for d in node.decorator_list
        ):
            count += node.end_lineno - node.lineno + 1 + len(node.decorator_list)
    return count


def kernel_share(root: Path) -> dict[str, tuple[int, int]]:
    """``{package: (kernel lines, all lines)}`` under each package's ``ops/`` folders."""
    shares: dict[str, tuple[int, int]] = {}
    for path in sorted(root.glob("packages/*/src/*/ops/**/*.py")):
        text = path.read_text(encoding="utf-8")
        package = path.relative_to(root).parts[1]
        kernels, total = shares.get(package, (0, 0))
        shares[package] = (kernels + kernel_lines(text), total + len(text.splitlines()))
    return shares


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()
    shares = kernel_share(root)
    for package, (kernels, total) in shares.items():
        print(f"{package:28s} {kernels:6d} / {total:6d}  {kernels / max(total, 1):6.1%}")
    kernels, total = (sum(v) for v in zip(*shares.values()))
    print(f"{'all packages':28s} {kernels:6d} / {total:6d}  {kernels / max(total, 1):6.1%}")


if __name__ == "__main__":
    main()
