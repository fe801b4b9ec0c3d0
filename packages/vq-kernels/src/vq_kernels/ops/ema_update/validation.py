"""The metadata checks of ``ema_statistics`` and ``ema_update_`` calls."""

from __future__ import annotations

from typing import NamedTuple

import torch

from triton_dispatch import common_device, select_backend

from .._validation import (
    require_contiguous,
    require_float,
    require_integer,
    require_shape,
    require_tensor,
)
from .reference import SEMANTICS

#: Dead-code thresholds used when ``dead_threshold`` is left at its default: steps without an
#: assignment for ``active_only``, EMA cluster size for ``decay_all``.
DEFAULT_THRESHOLDS = {"active_only": 20, "decay_all": 2.0}

# The default of ``dead_threshold``: None already means "no restarts", so "the threshold of the
# chosen semantics" needs a value of its own.
DEFAULT_FOR_SEMANTICS = object()


def check_statistics(x, codes, backend) -> str:
    """Every metadata check of :func:`ema_statistics`; returns the backend."""
    require_tensor("x", x)
    require_tensor("codes", codes)
    require_float("x", x)
    require_integer("codes", codes)
    if x.dim() not in (2, 3) or codes.shape != x.shape[:-1]:
        raise ValueError(
            f"x must be (B, D) or (L, B, D) and codes x.shape[:-1]; got x {tuple(x.shape)}, "
            f"codes {tuple(codes.shape)}"
        )
    return select_backend(device=common_device([x, codes], names=["x", "codes"]), backend=backend)


def _check_threshold(semantics: str, dead_threshold) -> float | None:
    if dead_threshold is DEFAULT_FOR_SEMANTICS:
        return float(DEFAULT_THRESHOLDS[semantics])
    if dead_threshold is None:
        return None
    if isinstance(dead_threshold, bool) or not isinstance(dead_threshold, (int, float)):
        raise TypeError(f"dead_threshold must be a number or None, got {dead_threshold!r}")
    if not dead_threshold > 0:
        raise ValueError(
            f"dead_threshold must be > 0 (or None to disable restarts), got {dead_threshold}: "
            "a threshold <= 0 would declare every code dead at every step"
        )
    return float(dead_threshold)


class ResolvedUpdate(NamedTuple):
    """A validated update: sizes, the restart threshold, device and backend."""

    stacked: bool
    levels: int
    batch: int
    num_codes: int
    dim: int
    threshold: float | None
    device: torch.device
    chosen: str


def resolve_update(
    x, codes, codebook, cluster_size, embed_sum, steps_since_active, decay, eps, semantics,
    dead_threshold, candidates, generator, backend,
) -> ResolvedUpdate:  # fmt: skip
    """Every check that needs only metadata; the clear errors of :func:`ema_update_`."""
    for name, t in (
        ("x", x),
        ("codes", codes),
        ("codebook", codebook),
        ("cluster_size", cluster_size),
        ("embed_sum", embed_sum),
    ):
        require_tensor(name, t)
    if semantics not in SEMANTICS:
        raise ValueError(f"semantics must be one of {SEMANTICS}, got {semantics!r}")
    threshold = _check_threshold(semantics, dead_threshold)
    if not isinstance(decay, (int, float)) or not 0.0 <= float(decay) <= 1.0:
        raise ValueError(f"decay must be a number in [0, 1], got {decay!r}")
    if not isinstance(eps, (int, float)) or not float(eps) > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    if x.dim() not in (2, 3):
        raise ValueError(f"x must be (B, D) or (L, B, D), got shape {tuple(x.shape)}")
    stacked = x.dim() == 3
    require_float("x", x)
    require_integer("codes", codes)
    require_float("codebook", codebook)
    require_float("cluster_size", cluster_size, (torch.float32, torch.float64))
    require_float("embed_sum", embed_sum, (cluster_size.dtype,))
    lead = x.shape[:1] if stacked else ()
    dim = x.shape[-1]
    batch = x.shape[-2]
    if codebook.dim() != x.dim() or codebook.shape[:-2] != lead or codebook.shape[-1] != dim:
        want = "(L, K, D)" if stacked else "(K, D)"
        raise ValueError(
            f"codebook must have shape {want} matching x {tuple(x.shape)} (D = {dim}), "
            f"got {tuple(codebook.shape)}"
        )
    num_codes = codebook.shape[-2]
    levels = x.shape[0] if stacked else 1
    require_shape("codes", codes, (*lead, batch), "(L, B)" if stacked else "(B,)")
    require_shape("cluster_size", cluster_size, (*lead, num_codes), "(L, K)" if stacked else "(K,)")
    require_shape(
        "embed_sum", embed_sum, (*lead, num_codes, dim), "(L, K, D)" if stacked else "(K, D)"
    )
    if steps_since_active is not None:
        require_tensor("steps_since_active", steps_since_active)
        require_integer("steps_since_active", steps_since_active)
        require_shape(
            "steps_since_active",
            steps_since_active,
            (*lead, num_codes),
            "(L, K)" if stacked else "(K,)",
        )
    elif semantics == "active_only" and threshold is not None:
        raise ValueError(
            "steps_since_active is required for semantics='active_only' with restarts "
            "(pass an int tensor of zeros of shape (K,) / (L, K), or dead_threshold=None)"
        )
    if candidates is not None:
        require_tensor("candidates", candidates)
        require_integer("candidates", candidates)
        require_shape("candidates", candidates, (*lead, num_codes), "(L, K)" if stacked else "(K,)")
    tensors = [x, codes, codebook, cluster_size, embed_sum, steps_since_active, candidates]
    names = [
        "x",
        "codes",
        "codebook",
        "cluster_size",
        "embed_sum",
        "steps_since_active",
        "candidates",
    ]
    device = common_device(tensors, names=names)
    if generator is not None and torch.device(generator.device).type != device.type:
        raise ValueError(f"generator is on {generator.device} but the tensors are on {device}")
    for name, t in zip(names[2:6], tensors[2:6]):
        if t is not None:
            require_contiguous(name, t)
    chosen = select_backend(device=device, backend=backend)
    return ResolvedUpdate(stacked, levels, batch, num_codes, dim, threshold, device, chosen)


def check_code_range(codes: torch.Tensor, num_codes: int) -> None:
    """The opt-in value check (reads two numbers back: a device sync on CUDA)."""
    if codes.numel() > 0:
        low, high = int(codes.min()), int(codes.max())
        if low < 0 or high >= num_codes:
            raise ValueError(
                f"codes must lie in [0, K) = [0, {num_codes}); got values in [{low}, {high}]"
            )
