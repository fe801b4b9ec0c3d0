"""Backend choice that torch.compile can trace.

``triton_dispatch.select_backend`` asks ``importlib`` whether Triton is installed, which dynamo
refuses to trace (a graph break, an error under ``fullgraph=True``). The choice depends only on the
device type, the request and the environment, so it is computed once per trace as a constant.
"""

from __future__ import annotations

import torch

from triton_dispatch import select_backend


@torch.compiler.assume_constant_result
def _select(device_type: str, request: str | None) -> str:
    return select_backend(device=torch.device(device_type), backend=request)


def backend_for(device: torch.device, request: str | None) -> str:
    """``select_backend`` for tensors on ``device`` (already checked to share it)."""
    return _select(device.type, request)
