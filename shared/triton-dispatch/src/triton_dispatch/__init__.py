"""Shared Triton utilities: backend dispatch, device facts, autotune helpers, and the testing and
benchmark kits every kernel package of this workspace builds on."""

from importlib.metadata import PackageNotFoundError, version

from .autotune import (
    autotune,
    config_space,
    next_power_of_2,
    padded_dim,
    prune_by_shared_memory,
    shape_bucket,
    tile_shared_memory,
)
from .autotune_mode import (
    AUTOTUNE_ENV_VAR,
    autotune_enabled,
    benchmark_count,
    set_autotune,
    tuned_kernels,
)
from .backend import (
    BACKEND_ENV_VAR,
    BACKENDS,
    Backend,
    BackendUnavailableError,
    common_device,
    interpreter_enabled,
    select_backend,
    triton_available,
    uses_triton,
)
from .demo import DEMO_ENTRY_POINT_GROUP, DemoResult
from .device import DeviceFacts, device_facts
from .graphs import CapturedStep, prepare_optimizer_for_capture
from .prime import start as _start_prime
from .shared_memory import SharedMemoryError

try:
    __version__ = version("triton-dispatch")
except PackageNotFoundError:  # a source tree on PYTHONPATH
    __version__ = "0.0.0"

__all__ = [
    "AUTOTUNE_ENV_VAR",
    "BACKENDS",
    "BACKEND_ENV_VAR",
    "DEMO_ENTRY_POINT_GROUP",
    "Backend",
    "BackendUnavailableError",
    "CapturedStep",
    "DemoResult",
    "DeviceFacts",
    "SharedMemoryError",
    "__version__",
    "autotune",
    "autotune_enabled",
    "benchmark_count",
    "common_device",
    "config_space",
    "device_facts",
    "interpreter_enabled",
    "next_power_of_2",
    "padded_dim",
    "prepare_optimizer_for_capture",
    "prune_by_shared_memory",
    "select_backend",
    "set_autotune",
    "shape_bucket",
    "tile_shared_memory",
    "triton_available",
    "tuned_kernels",
    "uses_triton",
]

# Triton's once-per-process start (its cache key, the CUDA driver module) on background threads,
# so the first compile does not wait for it (:mod:`triton_dispatch.prime`)
_start_prime()
