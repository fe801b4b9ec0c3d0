"""Whole-step CUDA-graph capture for reconstruction training: :class:`CapturedStep` and
:func:`prepare_optimizer_for_capture` live in :mod:`triton_dispatch.graphs` (shared with the other
packages) and are re-exported here."""

from __future__ import annotations

from triton_dispatch.graphs import CapturedStep, prepare_optimizer_for_capture

__all__ = ["CapturedStep", "prepare_optimizer_for_capture"]
