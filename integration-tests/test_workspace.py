"""Cross-package checks: every kernel package installs beside the others and depends on the shared
utilities by a version range that admits the installed triton-dispatch."""

from __future__ import annotations

import importlib
import re
from importlib import metadata
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").is_file())


def _project(folder: Path) -> dict:
    return tomllib.loads((folder / "pyproject.toml").read_text())["project"]


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


@pytest.mark.parametrize("folder", PACKAGES, ids=lambda p: p.name)
def test_package_depends_on_triton_dispatch_by_range(folder):
    deps = [
        d
        for d in _project(folder)["dependencies"]
        if d.replace("_", "-").startswith("triton-dispatch")
    ]
    assert len(deps) == 1, f"{folder.name} must depend on triton-dispatch exactly once"
    spec = deps[0]
    assert ">=" in spec and "<" in spec.replace("<=", ""), (
        f"{folder.name}: use a version range, got {spec!r}"
    )
    lower = re.search(r">=\s*([\d.]+)", spec).group(1)
    upper = re.search(r"<\s*([\d.]+)", spec).group(1)
    installed = _version_tuple(metadata.version("triton-dispatch"))
    assert _version_tuple(lower) <= installed < _version_tuple(upper)


@pytest.mark.parametrize("folder", PACKAGES, ids=lambda p: p.name)
def test_package_has_release_files_and_imports(folder):
    for name in ("README.md", "CHANGELOG.md"):
        assert (folder / name).is_file(), f"{folder.name} lacks {name}"
    module = next((folder / "src").iterdir()).name
    assert importlib.import_module(module).__version__ == _project(folder)["version"]


def test_registered_demos_point_at_callables():
    from triton_dispatch import DEMO_ENTRY_POINT_GROUP

    for ep in metadata.entry_points(group=DEMO_ENTRY_POINT_GROUP):
        assert callable(ep.load()), ep
