"""The autotuning switch, and the registry of tuned kernels (no Triton import: the package must
import before ``TRITON_INTERPRET`` is read, and on machines without Triton).

Autotuning is off by default: kernels take their launch configs from their package's table or a
heuristic (:mod:`triton_dispatch.tuned_kernel`). One environment variable switches it on for every
package, ``TRITON_DISPATCH_AUTOTUNE`` (``1``/``all``, or a comma list of package import names);
``<PACKAGE>_AUTOTUNE`` (``LATE_INTERACTION_KERNELS_AUTOTUNE=1``) for one package, and
:func:`set_autotune` at run time, override it.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

#: ``1``/``all`` autotunes every package's kernels; a comma list names packages (import names).
AUTOTUNE_ENV_VAR = "TRITON_DISPATCH_AUTOTUNE"

_TRUE = ("1", "true", "yes", "on", "all")
_FALSE = ("", "0", "false", "no", "off")

_overrides: dict[str | None, bool] = {}
_kernels: weakref.WeakSet[Any] = weakref.WeakSet()
_benchmarks = 0


def set_autotune(enabled: bool | None, package: str | None = None) -> None:
    """Switch autotuning on or off for ``package`` (an import name), or for every package when
    ``package`` is ``None``; ``enabled=None`` drops the override and the environment decides
    again. Regimes already chosen in this process keep their config."""
    if enabled is None:
        _overrides.pop(package, None)
    else:
        _overrides[package] = bool(enabled)


def autotune_enabled(package: str) -> bool:
    """Whether kernels of ``package`` benchmark their space on a new regime."""
    for scope in (package, None):
        if scope in _overrides:
            return _overrides[scope]
    own = os.environ.get(f"{package.upper()}_AUTOTUNE")
    if own is not None and own.strip().lower() in _TRUE + _FALSE:
        return own.strip().lower() in _TRUE
    value = os.environ.get(AUTOTUNE_ENV_VAR, "").strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    return package.lower() in {p.strip() for p in value.split(",")}


def benchmark_count() -> int:
    """Autotune trials run in this process (every package): 0 unless autotuning was on."""
    return _benchmarks


def tuned_kernels(package: str | None = None) -> list[Any]:
    """Every live :class:`~triton_dispatch.tuned_kernel.TunedKernel`, of one package or all."""
    found = [k for k in _kernels if package is None or k.package == package]
    return sorted(found, key=lambda k: (k.package, k.name))


def register(kernel: Any) -> None:
    """Note a new tuned kernel (for :func:`tuned_kernels`)."""
    _kernels.add(kernel)


def count_benchmark() -> None:
    """Note one autotune trial (for :func:`benchmark_count`)."""
    global _benchmarks
    _benchmarks += 1


__all__ = [
    "AUTOTUNE_ENV_VAR",
    "autotune_enabled",
    "benchmark_count",
    "set_autotune",
    "tuned_kernels",
]
