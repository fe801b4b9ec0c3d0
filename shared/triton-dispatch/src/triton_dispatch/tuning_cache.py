"""Autotuning results kept on disk, so a restarted process never benchmarks the same regime again.

One JSON file per kernel and identity under ``$TRITON_DISPATCH_CACHE_DIR`` (default
``~/.cache/triton-dispatch/autotune``). The identity is a hash of the device, the Triton version,
the kernel's source (Triton's own hash of it and the functions it calls) and its config space: a
new driver of any of them reads another file, so stale results are never used. A file that cannot
be read, or whose recorded identity differs from the one asked for, is ignored with a warning.
``TRITON_DISPATCH_TUNING_CACHE=0`` turns reading and writing off. The picks of the first-call
short tune (:mod:`triton_dispatch.bounded_tune`) are kept here too, in files of their own.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .launch_configs import config_from_json, config_to_json, jsonable

#: Where the files go (default ``$XDG_CACHE_HOME/triton-dispatch/autotune``).
CACHE_DIR_ENV_VAR = "TRITON_DISPATCH_CACHE_DIR"
#: ``0`` turns the on-disk autotuning results off (neither read nor written).
CACHE_ENV_VAR = "TRITON_DISPATCH_TUNING_CACHE"

_FORMAT = 1


def cache_enabled() -> bool:
    return os.environ.get(CACHE_ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    explicit = os.environ.get(CACHE_DIR_ENV_VAR)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "triton-dispatch" / "autotune"


def identity(
    *, kernel: str, device: str, triton_version: str, source: str, space: str, search: str = "full"
) -> dict:
    """What a file's results depend on; the file name holds its hash. ``search`` says how the
    results were found: ``"full"`` (autotuning over the space) or ``"bounded"`` (a short list,
    :mod:`triton_dispatch.bounded_tune`), kept apart so that opting into full autotuning never
    reads a short list's pick."""
    ident = {
        "kernel": kernel,
        "device": device,
        "triton": triton_version,
        "source": source,
        "space": hashlib.sha256(space.encode()).hexdigest()[:16],
    }
    if search != "full":  # full searches keep the identities (and files) they always had
        ident["search"] = search
    return ident


def _path(ident: Mapping[str, str]) -> Path:
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / f"{ident['kernel'][:80]}-{digest}.json"


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def load(ident: Mapping[str, str]) -> dict[str, tuple[Any, float | None]]:
    """Stored results of one kernel identity: ``{json key string: (config, ms)}``. ``{}`` when
    there is no file; a corrupt or foreign file is ignored with a warning."""
    if not cache_enabled():
        return {}
    path = _path(ident)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        _warn(f"ignoring autotuning cache {path}: {exc}")
        return {}
    try:
        data = json.loads(text)
        if data.get("format") != _FORMAT or data.get("identity") != dict(ident):
            _warn(f"ignoring autotuning cache {path}: written for another kernel or Triton")
            return {}
        return {
            entry["key"]: (config_from_json(entry["config"]), entry.get("ms"))
            for entry in data["entries"]
        }
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        _warn(f"ignoring corrupt autotuning cache {path}: {exc!r}")
        return {}


def key_string(key: Mapping[str, Any]) -> str:
    """A regime key as the stable string the cache files index by."""
    return json.dumps({k: jsonable(v) for k, v in key.items()}, sort_keys=True)


def store(ident: Mapping[str, str], key: Mapping[str, Any], config, ms: float | None) -> None:
    """Add one result to its identity's file (read, merge, atomic replace). Failing to write is a
    warning: the result still holds for this process."""
    if not cache_enabled():
        return
    path = _path(ident)
    entries = {k: (c, t) for k, (c, t) in load(ident).items()}
    entries[key_string(key)] = (config, ms)
    data = {
        "format": _FORMAT,
        "identity": dict(ident),
        "entries": [
            {"key": k, "config": config_to_json(c), "ms": t} for k, (c, t) in entries.items()
        ],
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except OSError as exc:
        _warn(f"could not write autotuning cache {path}: {exc}")


__all__ = ["CACHE_DIR_ENV_VAR", "CACHE_ENV_VAR", "cache_dir", "cache_enabled", "identity",
           "key_string", "load", "store"]  # fmt: skip
