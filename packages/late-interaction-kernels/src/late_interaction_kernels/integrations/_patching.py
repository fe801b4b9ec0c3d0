"""Bookkeeping shared by the third-party patchers: every replaced attribute is recorded with its
original object so that unpatching restores exactly what was there (checked by identity), the
version gate, the kill switch and the routing rule.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch

logger = logging.getLogger("late_interaction_kernels.integrations")

#: Set to ``1`` (or ``true``/``yes``/``on``) to make every ``patch_*`` call a logged no-op.
DISABLE_ENV_VAR = "LATE_INTERACTION_KERNELS_DISABLE_PATCH"

_MISSING = object()


class UnsupportedVersionError(RuntimeError):
    """The installed third-party library is outside the range a patcher was written for."""


def patching_disabled() -> bool:
    return os.environ.get(DISABLE_ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on")


def _release(text: str) -> tuple[int, ...]:
    """The numeric release of a version string: ``"1.0.0rc1+local"`` -> ``(1, 0, 0)``."""
    parts: list[int] = []
    for piece in text.split("+")[0].split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if digits != piece:  # "0rc1": keep the number, stop at the pre-release tag
            break
    return tuple(parts)


def installed_version(dist: str, *, minimum: str, below: str | None) -> str:
    """The installed version of ``dist``, or a clear error when it is missing or out of range."""
    try:
        found = version(dist)
    except PackageNotFoundError as exc:
        raise ImportError(
            f"{dist} is not installed; install it with the matching extra of "
            f"late-interaction-kernels (supported: {dist}>={minimum}"
            f"{f',<{below}' if below else ''})"
        ) from exc
    release = _release(found)
    if release < _release(minimum) or (below is not None and release >= _release(below)):
        raise UnsupportedVersionError(
            f"{dist} {found} is not supported by this patcher; supported versions are "
            f">={minimum}{f',<{below}' if below else ''}. Upgrade {dist}, or leave it unpatched "
            f"and call late_interaction_kernels.maxsim directly."
        )
    return found


def routes_to_kernels(*tensors: Any) -> bool:
    """Whether a patched call should run the fused kernels.

    Only when every argument is a tensor on one device where the Triton kernels run (CUDA, or CPU
    under ``TRITON_INTERPRET=1``); anything else (MPS, plain CPU, lists, mixed devices) keeps the
    library's original code, so the patch never changes results there.
    """
    from triton_dispatch import select_backend, uses_triton

    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        return False
    if any(t.device != tensors[0].device for t in tensors[1:]):
        return False
    if any(not t.is_floating_point() or t.dtype == torch.float64 for t in tensors):
        return False
    try:
        return uses_triton(select_backend(*tensors))
    except ValueError:  # a forced backend that cannot run here: leave the original in charge
        return False


@dataclass
class PatchSet:
    """The attributes one patcher replaced, in order, with what was there before."""

    name: str
    records: list[tuple[Any, str, Any]] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return bool(self.records)

    def replace(self, owner: Any, attr: str, new: Any) -> None:
        """Set ``owner.attr = new``, remembering the original (once per owner and attribute)."""
        if isinstance(owner, type):
            # an inherited attribute is not the class's own: restoring deletes ours again
            old = owner.__dict__.get(attr, _MISSING)
            if old is _MISSING and not hasattr(owner, attr):
                raise AttributeError(f"{owner!r} has no attribute {attr!r} to patch")
        else:
            old = getattr(owner, attr)
        self.records.append((owner, attr, old))
        setattr(owner, attr, new)

    def restore(self) -> None:
        """Undo every replacement, newest first, so each attribute ends as the original object."""
        for owner, attr, old in reversed(self.records):
            if old is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, old)
        self.records.clear()
        self.summary.clear()

    def swap_module_globals(
        self, modules: list[Any], originals: dict[int, Any], replacement_for: Callable[[Any], Any]
    ) -> None:
        """Replace every module-level name bound to one of ``originals`` (by identity): the copies
        that ``from x import f`` made at import time."""
        for module in modules:
            for attr, value in list(vars(module).items()):
                if id(value) in originals and value is originals[id(value)]:
                    self.replace(module, attr, replacement_for(value))

    def swap_defaults(
        self, functions: list[Any], originals: dict[int, Any], replacement_for: Callable[[Any], Any]
    ) -> None:
        """Replace default argument values bound to one of ``originals`` (defaults are evaluated
        when the function is defined, so patching the module later does not reach them)."""
        for fn in functions:
            defaults = getattr(fn, "__defaults__", None)
            if defaults and any(id(v) in originals and v is originals[id(v)] for v in defaults):
                self.replace(
                    fn,
                    "__defaults__",
                    tuple(
                        replacement_for(v) if id(v) in originals and v is originals[id(v)] else v
                        for v in defaults
                    ),
                )
            kwdefaults = getattr(fn, "__kwdefaults__", None)
            if kwdefaults and any(
                id(v) in originals and v is originals[id(v)] for v in kwdefaults.values()
            ):
                self.replace(
                    fn,
                    "__kwdefaults__",
                    {
                        k: replacement_for(v) if id(v) in originals and v is originals[id(v)] else v
                        for k, v in kwdefaults.items()
                    },
                )

    def log(self, library: str, library_version: str) -> None:
        logger.info(
            "late-interaction-kernels patched %s %s: %s",
            library,
            library_version,
            "; ".join(self.summary) or "nothing",
        )
