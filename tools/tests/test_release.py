import datetime as dt
import shutil
from pathlib import Path

import pytest

from repo_tools.release import (
    ReleaseError,
    bump,
    bumped,
    check_changelog,
    package_dir,
    workspace_root,
)

ROOT = Path(__file__).resolve().parents[2]


def test_bumped():
    assert bumped("0.1.9", "patch") == "0.1.10"
    assert bumped("0.1.9", "minor") == "0.2.0"
    assert bumped("1.4.2", "major") == "2.0.0"
    with pytest.raises(ReleaseError):
        bumped("1.0", "patch")


def test_every_package_has_a_changelog_entry_for_its_version():
    root = workspace_root(ROOT)
    for name in [
        "triton-dispatch",
        "late-interaction-kernels",
        "vq-kernels",
        "tomo-kplanes",
        "stream-dit",
    ]:
        folder = package_dir(root, name)
        check_changelog(
            folder,
            __import__("tomllib").loads((folder / "pyproject.toml").read_text())["project"][
                "version"
            ],
        )


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "pkg"
    shutil.copytree(
        package_dir(ROOT, "vq-kernels"),
        folder,
        ignore=shutil.ignore_patterns("tests", "src", "benchmarks"),
    )
    return folder


def test_bump_needs_release_notes(tmp_path):
    folder = _copy(tmp_path)
    changelog = folder / "CHANGELOG.md"
    text = changelog.read_text()
    start = text.index("## [Unreleased]\n") + len("## [Unreleased]\n")
    changelog.write_text(text[:start] + "\n" + text[text.index("## [", start) :])
    with pytest.raises(ReleaseError, match="Unreleased"):
        bump(folder, "patch")


def test_bump_moves_unreleased_notes_and_sets_version(tmp_path):
    folder = _copy(tmp_path)
    changelog = folder / "CHANGELOG.md"
    changelog.write_text(
        changelog.read_text().replace(
            "## [Unreleased]\n", "## [Unreleased]\n\n### Fixed\n- a bug\n"
        )
    )
    old = __import__("tomllib").loads((folder / "pyproject.toml").read_text())["project"]["version"]
    new = bump(folder, "minor", today=dt.date(2030, 1, 2))
    assert new == bumped(old, "minor")
    text = changelog.read_text()
    assert f"## [Unreleased]\n\n## [{new}] - 2030-01-02\n\n### Fixed\n- a bug" in text
    assert f'version = "{new}"' in (folder / "pyproject.toml").read_text()
    check_changelog(folder, new)
