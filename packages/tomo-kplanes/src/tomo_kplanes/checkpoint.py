"""Checkpoints that a crash cannot corrupt and a crafted file cannot run code from.

A checkpoint holds only tensors and plain containers (dicts, lists, tuples, numbers, strings), so it
loads with ``torch.load(weights_only=True)``. It is written to a temporary file in the same folder,
flushed and fsynced, then renamed over the old one: a kill at any moment leaves either the old or
the new checkpoint, never a torn one.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import torch


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` to ``path`` atomically (temporary file, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)  # make the rename itself durable
    return path


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # folders cannot be opened on some platforms (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_checkpoint(path: str | Path, map_location: torch.device | str | None = None) -> dict:
    """Read a checkpoint written by :func:`save_checkpoint` with ``weights_only=True``.

    Raises:
        ValueError: the file is not a checkpoint, or it holds objects other than tensors and plain
            containers (which could run code when unpickled).
    """
    path = Path(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        # PyTorch's own message advises weights_only=False, an unsafe load: never pass it on
        raise ValueError(
            f"{path} is not a tomo-kplanes checkpoint: it holds objects other than tensors and "
            "plain containers, which are not unpickled (unpickling them could run code)"
        ) from None
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except Exception as exc:  # a text file, a torn zip, another format: torch fails in many ways
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(
            f"{path} is not a tomo-kplanes checkpoint (not a file torch.save wrote: {reason})"
        ) from None
    if not isinstance(state, dict):
        raise ValueError(
            f"{path} is not a tomo-kplanes checkpoint: it holds a {type(state).__name__}, not a dict"
        )
    return state
