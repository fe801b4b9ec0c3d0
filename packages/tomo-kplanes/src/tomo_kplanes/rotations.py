"""Projection of free 3×3 parameters onto SO(3); the op lives in ``ops/nearest_rotation``."""

from __future__ import annotations

import torch

from .ops.nearest_rotation import nearest_rotation


def project_to_so3(matrices: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """The nearest rotation (Frobenius norm) to each ``(..., 3, 3)`` matrix, differentiably: the
    SVD polar factor on CPU, one Triton program (no host synchronisation) on CUDA."""
    return nearest_rotation(matrices, backend=backend)
