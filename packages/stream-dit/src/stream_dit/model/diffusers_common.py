"""Pieces the diffusers adapters share: preset lookup, a seeded model build, and swapping the
attention processors of a model for a block (the parity oracles run diffusers' own)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

import torch
from torch import nn

P = TypeVar("P")
M = TypeVar("M", bound=nn.Module)


def resolve_preset(preset: str | P, presets: Mapping[str, P], preset_type: type, noun: str) -> P:
    """``presets[preset]`` for a name, ``preset`` itself for an instance of ``preset_type``
    (``noun`` names that type in the error, article included)."""
    if isinstance(preset, str):
        if preset not in presets:
            raise ValueError(f"preset={preset!r} is not one of {sorted(presets)}")
        return presets[preset]
    if not isinstance(preset, preset_type):
        raise TypeError(f"preset must be a preset name or {noun}, got {type(preset).__name__}")
    return preset


def seeded_model(
    build: Callable[..., M], kwargs: dict, *, seed: int, device: torch.device | str, dtype
) -> M:
    """``build(**kwargs)`` with weights drawn on ``device`` under ``seed`` (the global RNG state is
    left as it was), cast to ``dtype``, in eval mode without gradients."""
    device = torch.device(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(int(seed))
        with device:
            model = build(**kwargs)
    if dtype != torch.float32:
        # nn.Module.to: ModelMixin.to warns about modules to keep in float32; every module is
        # wanted in the requested dtype, as the engines expect
        nn.Module.to(model, dtype=dtype)
    model.eval().requires_grad_(False)
    return model


@contextlib.contextmanager
def swapped_processors(modules: Sequence[nn.Module], processor: object) -> Iterator[None]:
    """Run the block with ``processor`` on every module of ``modules``, restoring theirs after."""
    saved = [m.processor for m in modules]
    try:
        for m in modules:
            m.processor = processor
        yield
    finally:
        for m, p in zip(modules, saved):
            m.processor = p
