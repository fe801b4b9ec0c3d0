"""Keep a Ray started on this machine on the loopback interface.

Ray gives each node the address other nodes reach it at, and a Ray started by ``ray.init()`` on
a Linux machine listens on that network address. A one-host deployment (``stream-dit serve
--ray`` without ``--ray-address``, the tests, the load benchmark) needs none of that: with
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` Ray takes 127.0.0.1 as its node address, as it does on
macOS. Ray reads the variable when it is imported, in this process and in every process it
starts, so it must be set before ``import ray``. This module imports nothing of Ray.
"""

from __future__ import annotations

import os
import sys

__all__ = ["keep_ray_on_loopback", "keep_ray_workers_in_this_environment"]

_VARIABLE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def keep_ray_on_loopback() -> None:
    """Make a Ray started from this process use 127.0.0.1 (unless the variable is set already).

    Raises:
        RuntimeError: Ray was imported already (and read the variable's old value).
    """
    _set_before_ray_import(_VARIABLE, "0", "keep_ray_on_loopback")


_UV_HOOK = "RAY_ENABLE_UV_RUN_RUNTIME_ENV"


def keep_ray_workers_in_this_environment() -> None:
    """Make the workers of a Ray started from this process run this process's Python environment
    (unless the variable is set already).

    Under ``uv run`` Ray otherwise ships a copy of the working directory to its workers and has
    them ``uv run`` there, which builds a second environment from the lock for them (for this
    workspace 5.8 GB, and over half a minute on a 2-core machine) before a replica can start. One
    machine needs none of that: its workers can use the environment the driver runs in.

    Raises:
        RuntimeError: Ray was imported already (and read the variable's old value).
    """
    _set_before_ray_import(_UV_HOOK, "0", "keep_ray_workers_in_this_environment")


def _set_before_ray_import(name: str, value: str, caller: str) -> None:
    """Set ``name`` unless it is set already; Ray reads it when imported, so refuse once it is."""
    if name in os.environ:
        return
    if "ray" in sys.modules:
        raise RuntimeError(f"call {caller}() before ray is imported")
    os.environ[name] = value
