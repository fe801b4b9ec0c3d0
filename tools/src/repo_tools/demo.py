"""``uv run demo``: run the demo of every installed workspace package, one summary line each.

Packages are found, not listed: every installed distribution that depends on ``triton-dispatch`` is
a kernel package, and its demo is whatever it registers under the ``triton_dispatch.demos``
entry-point group.

Each demo writes into ``OUTPUT_DIR/<package>`` (``demo-output/<package>`` by default), a folder the
runner owns: running ``demo`` again replaces what the previous run wrote there. What a demo prints
itself goes to ``OUTPUT_DIR/<package>/demo.log`` (and to the terminal when the demo fails), so the
terminal shows one line per package.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import re
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

from triton_dispatch import DEMO_ENTRY_POINT_GROUP, DemoResult

#: where a demo's own printed lines go, inside its output folder
LOG_FILE = "demo.log"

_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def kernel_packages() -> list[str]:
    """Names of installed distributions that depend on triton-dispatch, sorted."""
    found = set()
    for dist in metadata.distributions():
        for req in dist.requires or []:
            match = _REQUIREMENT_NAME.match(req)
            if match and _normalise(match.group(1)) == "triton-dispatch" and "extra ==" not in req:
                name = _normalise(dist.metadata["Name"])
                if name != "repo-tools":
                    found.add(name)
    return sorted(found)


def registered_demos() -> dict[str, metadata.EntryPoint]:
    eps = metadata.entry_points(group=DEMO_ENTRY_POINT_GROUP)
    return {_normalise(ep.name): ep for ep in eps}


def unknown_package_message(names: list[str], known: list[str]) -> str | None:
    """One line naming the first of ``names`` that is not a known package (with the known names
    and the closest match, if any), or ``None`` when every name is known."""
    for name in names:
        if _normalise(name) in known:
            continue
        close = difflib.get_close_matches(_normalise(name), known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return (
            f"demo: error: unknown package {name!r}{hint}; "
            f"known packages: {', '.join(known) or 'none'}"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path("demo-output"),
        help="where demos write files, one folder per package; a new run replaces the files of "
        "the previous one (default: %(default)s)",
    )
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        metavar="PACKAGE",
        help="run only these packages (one name at least)",
    )
    args = parser.parse_args(argv)

    demos = registered_demos()
    packages = sorted(set(kernel_packages()) | set(demos))
    if args.only == []:
        # argparse takes a bare ``--only`` as no names, which would otherwise run every package;
        # its own "+" error could not list the names to choose from
        print(
            "demo: error: --only needs at least one package name; "
            f"known packages: {', '.join(packages) or 'none'}",
            file=sys.stderr,
        )
        return 2
    if args.only:
        message = unknown_package_message(args.only, packages)
        if message is not None:
            print(message, file=sys.stderr)
            return 2
        wanted = {_normalise(n) for n in args.only}
        packages = [p for p in packages if p in wanted]
    failures = 0
    width = max((len(p) for p in packages), default=0)
    for name in packages:
        label = name.ljust(width)
        ep = demos.get(name)
        if ep is None:
            print(f"{label}  no demo yet")
            continue
        out_dir = args.output_dir / name
        out_dir.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                result = ep.load()(out_dir)
            if not isinstance(result, DemoResult):
                raise TypeError(f"{ep.value} returned {type(result).__name__}, expected DemoResult")
        except Exception:
            failures += 1
            print(f"{label}  FAILED after {time.perf_counter() - start:.1f} s", flush=True)
            print(printed.getvalue(), end="", flush=True)
            traceback.print_exc()
            continue
        finally:
            log = out_dir / LOG_FILE
            if printed.getvalue():
                log.write_text(printed.getvalue(), encoding="utf-8")
            elif log.exists():  # the previous run's lines
                log.unlink()
        where = f" -> {out_dir}" if result.outputs else ""
        print(
            f"{label}  {result.summary} | backend={result.backend} | {result.key_figure} | "
            f"took {time.perf_counter() - start:.1f} s{where}",
            flush=True,
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
