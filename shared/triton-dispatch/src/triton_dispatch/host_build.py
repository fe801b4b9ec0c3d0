"""Quicker host-compiler builds of Triton's C launchers, for first calls with an empty cache.

Triton 3.x builds, with the host C compiler, one small C launcher per kernel signature and, once
per cache, its CUDA driver module, always at ``-O3``. With an empty Triton cache these builds are a
large share of a first call: each costs about as much as compiling a small kernel. The launcher is
argument parsing around one driver call, so the optimisation level barely moves its run time
(``BENCHMARKS.md``), while ``-O1`` builds it in a third to a half of the time.

:func:`install_fast_host_builds` plugs such a build into Triton's ``knobs.build.impl`` hook. Every
op's backend choice calls it on its first Triton call. It leaves Triton alone when the hook is
already taken (a user's own build wins), when the installed Triton is not one of
:data:`FAST_HOST_BUILD_TRITON_VERSIONS` or its build function is not the one this was written
against (the build repeats ``triton.runtime.build._build``'s command, an internal), or when
``TRITON_DISPATCH_FAST_HOST_BUILD=0``.
"""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sysconfig
import threading

from . import triton_version

#: Triton releases (``"major.minor"``) whose ``triton.runtime.build._build`` :func:`fast_build`
#: repeats at :data:`OPT_LEVEL`; on any other release Triton keeps its own builds.
FAST_HOST_BUILD_TRITON_VERSIONS: tuple[str, ...] = ("3.6",)
#: ``0`` keeps Triton's own ``-O3`` builds.
FAST_HOST_BUILD_ENV_VAR = "TRITON_DISPATCH_FAST_HOST_BUILD"
#: The optimisation level of launcher builds.
OPT_LEVEL = "-O1"

# the parameters of triton.runtime.build._build (Triton 3.6), whose command this build repeats
_BUILD_PARAMETERS = [
    "name",
    "src",
    "srcdir",
    "library_dirs",
    "include_dirs",
    "libraries",
    "ccflags",
]

_lock = threading.Lock()
_decided = False
_installed = False


def _enabled_by_env() -> bool:
    value = os.environ.get(FAST_HOST_BUILD_ENV_VAR, "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def fast_build(
    name: str,
    src: str,
    srcdir: str,
    library_dirs: list[str],
    include_dirs: list[str],
    libraries: list[str],
) -> str:
    """Build ``src`` into the shared object ``srcdir/<name><EXT_SUFFIX>`` as Triton 3.6's
    ``_build`` does (same compiler choice, include and library flags) at :data:`OPT_LEVEL`."""
    from triton import knobs
    from triton.runtime.build import _library_flag

    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    so = os.path.join(srcdir, f"{name}{suffix}")
    cc = knobs.build.cc or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise RuntimeError("no C compiler found for Triton's launcher: set CC")
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":  # Debian's scheme; the headers live under posix_prefix
        scheme = "posix_prefix"
    python_include = sysconfig.get_paths(scheme=scheme)["include"]
    includes = [*include_dirs, srcdir, python_include, *knobs.build.backend_dirs]
    command = [cc, src, OPT_LEVEL, "-shared", "-fPIC", "-Wno-psabi", "-o", so]
    command += [_library_flag(lib) for lib in libraries]
    command += [f"-L{d}" for d in library_dirs]
    command += [f"-I{d}" for d in includes if d is not None]
    subprocess.check_call(command, stdout=subprocess.DEVNULL)
    return so


def _hook_matches() -> bool:
    """Whether this Triton is a release this module was written for and has the build hook and
    the ``_build`` it mirrors."""
    if not triton_version.triton_release_in(FAST_HOST_BUILD_TRITON_VERSIONS):
        return False
    try:
        from triton import knobs
        from triton.runtime import build
    except ImportError:
        return False
    if not all(hasattr(build, name) for name in ("_build", "_library_flag")):
        return False
    if not hasattr(getattr(knobs, "build", None), "impl"):
        return False
    return list(inspect.signature(build._build).parameters) == _BUILD_PARAMETERS


def install_fast_host_builds() -> bool:
    """Route Triton's launcher builds through :func:`fast_build` (once per process); returns
    whether they are routed. Cheap after the first call."""
    global _decided, _installed
    if _decided:
        return _installed
    with _lock:
        if not _decided:
            if _enabled_by_env() and _hook_matches():
                from triton import knobs

                if knobs.build.impl is None:
                    knobs.build.impl = fast_build
            from triton import knobs

            _installed = getattr(getattr(knobs, "build", None), "impl", None) is fast_build
            _decided = True
    return _installed


def uninstall_fast_host_builds() -> None:
    """Give Triton its own builds back (and decide again on the next install)."""
    global _decided, _installed
    with _lock:
        try:
            from triton import knobs
        except ImportError:
            knobs = None
        if knobs is not None and getattr(knobs.build, "impl", None) is fast_build:
            knobs.build.impl = None
        _decided = _installed = False


__all__ = [
    "FAST_HOST_BUILD_ENV_VAR",
    "FAST_HOST_BUILD_TRITON_VERSIONS",
    "OPT_LEVEL",
    "fast_build",
    "install_fast_host_builds",
    "uninstall_fast_host_builds",
]
