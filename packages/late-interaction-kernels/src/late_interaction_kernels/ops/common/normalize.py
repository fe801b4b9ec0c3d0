"""The gradient through ``F.normalize`` in PyTorch, for the backward passes that normalise tokens
outside a kernel."""

from __future__ import annotations

import torch


def normalize_backward(grad_hat: torch.Tensor, x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Gradient w.r.t. ``x`` from the gradient w.r.t. ``F.normalize(x, dim=-1)``."""
    norm = x.norm(dim=-1, keepdim=True)
    x_hat = x / norm.clamp_min(eps)
    proj = torch.where(norm > eps, (grad_hat * x_hat).sum(-1, keepdim=True), 0.0)
    return (grad_hat - proj * x_hat) / norm.clamp_min(eps)
