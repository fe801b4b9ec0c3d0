"""Per-call backend choice: Triton on CUDA, the Triton interpreter, or the PyTorch reference.

The choice is a pure function of the tensors' devices, the explicit ``backend=`` keyword and two
environment variables. It never tries a launch and falls back on failure: a backend that cannot run
the given tensors is an error that says what would make it run.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from typing import Literal, get_args

import torch

from . import prime
from .host_build import install_fast_host_builds

Backend = Literal["triton", "interpret", "torch"]
BackendRequest = Literal["auto", "triton", "interpret", "torch"]

#: Environment variable that forces a backend for every call that does not pass ``backend=``.
BACKEND_ENV_VAR = "TRITON_DISPATCH_BACKEND"

BACKENDS: tuple[str, ...] = get_args(Backend)
_REQUESTS: tuple[str, ...] = get_args(BackendRequest)


class BackendUnavailableError(ValueError):
    """A forced backend cannot run on the tensors it was given."""


def interpreter_enabled() -> bool:
    """Whether ``TRITON_INTERPRET`` is set, so ``@triton.jit`` kernels run in the interpreter.

    Triton reads the variable when kernels are decorated: it must be set before the kernel modules
    are imported, which is why this is an environment fact and not a per-call switch.
    """
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in (
        "",
        "0",
        "false",
        "no",
        "off",
    )


# Looked up once at import: torch.compile cannot trace importlib, and select_backend must stay
# traceable so ops that dispatch through it run under torch.compile(fullgraph=True).
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def triton_available() -> bool:
    """Whether the ``triton`` package can be imported (it ships with torch on Linux only)."""
    return _TRITON_INSTALLED


def _normalise_request(backend: str | None, *, name: str = "backend") -> str:
    request = backend if backend is not None else os.environ.get(BACKEND_ENV_VAR, "auto")
    request = request.strip().lower() or "auto"
    if request not in _REQUESTS:
        source = f"{name}=" if backend is not None else f"{BACKEND_ENV_VAR}="
        raise ValueError(
            f"{source}{request!r} is not a backend; expected one of {', '.join(map(repr, _REQUESTS))}"
        )
    return request


def common_device(
    tensors: Iterable[torch.Tensor | None], *, names: Iterable[str] | None = None
) -> torch.device:
    """The single device shared by ``tensors`` (``None`` entries are skipped).

    Raises:
        ValueError: if there is no tensor, or the tensors live on different devices (the message
            names each argument and its device).
    """
    tensors = list(tensors)
    labels = list(names) if names is not None else [f"tensor {i}" for i in range(len(tensors))]
    seen: list[tuple[str, torch.device]] = [
        (label, t.device) for label, t in zip(labels, tensors) if t is not None
    ]
    if not seen:
        raise ValueError("common_device() needs at least one tensor")
    first = seen[0][1]
    if any(dev != first for _, dev in seen[1:]):
        listing = ", ".join(f"{label} on {dev}" for label, dev in seen)
        raise ValueError(f"all tensors must be on the same device; got {listing}")
    return first


def select_backend(
    *tensors: torch.Tensor | None,
    backend: str | None = None,
    device: torch.device | None = None,
) -> Backend:
    """Choose how to run one call.

    ``auto`` (the default) picks ``"interpret"`` when ``TRITON_INTERPRET=1``, ``"triton"`` for CUDA
    tensors when Triton is installed, and ``"torch"`` (the reference implementation) otherwise.
    ``backend=`` or the ``TRITON_DISPATCH_BACKEND`` variable force one; the keyword wins.

    Args:
        *tensors: the call's tensor arguments; ``None`` entries are ignored. All must share a device.
        backend: ``"auto"``, ``"triton"``, ``"interpret"`` or ``"torch"``; ``None`` reads the env var.
        device: the device to decide for when no tensor is given.

    Raises:
        ValueError: for an unknown backend name or tensors on different devices.
        BackendUnavailableError: when the forced backend cannot run these tensors.
    """
    request = _normalise_request(backend)
    if device is None:
        device = (
            common_device(tensors) if any(t is not None for t in tensors) else torch.device("cpu")
        )
    on_cuda = device.type == "cuda"

    if request == "auto":
        if interpreter_enabled() and triton_available() and device.type in ("cpu", "cuda"):
            return "interpret"
        if on_cuda and triton_available():
            return _compiled_triton()
        return "torch"
    if request == "torch":
        return "torch"
    if not triton_available():
        raise BackendUnavailableError(
            f"backend={request!r} needs the 'triton' package, which is not installed; "
            "use backend='torch' for the PyTorch reference"
        )
    if request == "interpret":
        if not interpreter_enabled():
            raise BackendUnavailableError(
                "backend='interpret' needs TRITON_INTERPRET=1 in the environment before triton is "
                "imported; use backend='torch' for the PyTorch reference"
            )
        if device.type not in ("cpu", "cuda"):
            raise BackendUnavailableError(
                f"backend='interpret' runs on CPU or CUDA tensors, got tensors on {device}"
            )
        return "interpret"
    # request == "triton"
    if interpreter_enabled():
        raise BackendUnavailableError(
            "backend='triton' compiles kernels for a GPU, but TRITON_INTERPRET=1 is set; "
            "use backend='interpret' (or 'auto'), or unset TRITON_INTERPRET"
        )
    if not on_cuda:
        raise BackendUnavailableError(
            f"backend='triton' needs CUDA tensors, got tensors on {device}; move them with .cuda(), "
            "set TRITON_INTERPRET=1 to run the kernels on CPU, or use backend='torch'"
        )
    return _compiled_triton()


def _compiled_triton() -> Backend:
    # the first compiled call of a process is where Triton will build its launchers, after the
    # start begun at import (:mod:`triton_dispatch.prime`)
    install_fast_host_builds()
    prime.wait()
    return "triton"


def uses_triton(backend: Backend) -> bool:
    """Whether ``backend`` runs the Triton kernels (compiled or interpreted)."""
    return backend in ("triton", "interpret")
