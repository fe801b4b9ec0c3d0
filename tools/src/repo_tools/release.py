"""``uv run release NAME``: bump one package's version, require its CHANGELOG entry, build it.

    uv run release vq-kernels --check            # CHANGELOG has an entry for the current version
    uv run release vq-kernels --bump minor       # move [Unreleased] to the new version, set it
    uv run release vq-kernels --bump patch --build   # ... then `uv build --package vq-kernels`

A bump needs a non-empty ``## [Unreleased]`` section: the release notes are written before the
version exists, never after.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import re
import subprocess
import sys
from pathlib import Path

import tomllib

_VERSION_LINE = re.compile(r'^(version\s*=\s*")([^"]+)(")', re.MULTILINE)
_UNRELEASED = re.compile(
    r"^## \[Unreleased\]\s*\n(?P<body>.*?)(?=^## \[|\Z)", re.MULTILINE | re.DOTALL
)


class ReleaseError(RuntimeError):
    pass


def workspace_root(start: Path | None = None) -> Path:
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            data = tomllib.loads(pyproject.read_text())
            if "workspace" in data.get("tool", {}).get("uv", {}):
                return folder
    raise ReleaseError("not inside the uv workspace (no pyproject.toml with [tool.uv.workspace])")


def package_dir(root: Path, name: str) -> Path:
    members = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["uv"]["workspace"][
        "members"
    ]
    for pattern in members:
        for folder in sorted(root.glob(pattern)):
            pyproject = folder / "pyproject.toml"
            if (
                pyproject.is_file()
                and tomllib.loads(pyproject.read_text())["project"]["name"] == name
            ):
                return folder
    raise ReleaseError(f"no workspace package named {name!r}")


def bumped(version: str, part: str) -> str:
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version)
    if not match:
        raise ReleaseError(f"version {version!r} is not MAJOR.MINOR.PATCH")
    major, minor, patch = map(int, match.groups())
    if part == "major":
        return f"{major + 1}.0.0"
    if part == "minor":
        return f"{major}.{minor + 1}.0"
    if part == "patch":
        return f"{major}.{minor}.{patch + 1}"
    raise ReleaseError(f"unknown bump {part!r}; expected major, minor or patch")


def current_version(folder: Path) -> str:
    return tomllib.loads((folder / "pyproject.toml").read_text())["project"]["version"]


def check_changelog(folder: Path, version: str) -> None:
    changelog = folder / "CHANGELOG.md"
    if not changelog.is_file():
        raise ReleaseError(f"{changelog} is missing")
    if not re.search(rf"^## \[{re.escape(version)}\]", changelog.read_text(), re.MULTILINE):
        raise ReleaseError(f"{changelog} has no '## [{version}]' entry")


def bump(folder: Path, part: str, *, today: _dt.date | None = None) -> str:
    """Set the new version in pyproject.toml and turn [Unreleased] into its CHANGELOG entry."""
    old = current_version(folder)
    new = bumped(old, part)
    changelog = folder / "CHANGELOG.md"
    text = changelog.read_text() if changelog.is_file() else ""
    match = _UNRELEASED.search(text)
    if match is None or not match.group("body").strip():
        raise ReleaseError(f"{changelog}: write the release notes under '## [Unreleased]' first")
    date = (today or _dt.date.today()).isoformat()
    text = (
        text[: match.start()]
        + f"## [Unreleased]\n\n## [{new}] - {date}\n\n{match.group('body')}"
        + text[match.end() :]
    )
    pyproject = folder / "pyproject.toml"
    source = pyproject.read_text()
    updated, count = _VERSION_LINE.subn(rf"\g<1>{new}\g<3>", source, count=1)
    if count != 1:
        raise ReleaseError(f"{pyproject}: no version line to update")
    pyproject.write_text(updated)
    changelog.write_text(text)
    return new


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="release", description="bump, check and build one package"
    )
    parser.add_argument("name", help="the package's distribution name, e.g. vq-kernels")
    parser.add_argument("--bump", choices=["major", "minor", "patch"], help="bump the version")
    parser.add_argument("--check", action="store_true", help="only check the CHANGELOG entry")
    parser.add_argument("--build", action="store_true", help="build sdist and wheel into dist/NAME")
    args = parser.parse_args(argv)
    try:
        root = workspace_root()
        folder = package_dir(root, args.name)
        version = bump(folder, args.bump) if args.bump else current_version(folder)
        check_changelog(folder, version)
        print(f"{args.name} {version}: CHANGELOG entry present")
        if args.build:
            out = root / "dist" / args.name
            subprocess.run(
                ["uv", "build", "--package", args.name, "--out-dir", str(out)], check=True, cwd=root
            )
            print(f"built into {out}")
    except (ReleaseError, subprocess.CalledProcessError) as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
