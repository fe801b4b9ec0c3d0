"""What the session needs from an engine: a batched forward and its limits."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Engine(Protocol):
    """Runs a denoiser on padded batches.

    Attributes:
        max_batch: the batch ceiling: the most rows one ``forward`` accepts.
        max_frames, max_cond_len: the largest T and L it accepts.
        reuses_output: True when the tensor ``forward`` returns is overwritten by the next call
            (CUDA graphs, TensorRT bindings): callers must copy it before calling again.
        device: where inputs must live.

    An engine whose ``forward`` also takes ``conditioned_rows=k`` (the rows from ``k`` on have
    no conditioning tokens) says so with a true ``takes_conditioned_rows`` attribute; the session
    passes it only then.
    """

    max_batch: int
    max_frames: int
    max_cond_len: int
    reuses_output: bool
    device: torch.device
    latent_channels: int
    cond_dim: int
    context_channels: int

    def frames_bucket(self, frames: int) -> int:
        """The padded T the engine runs for a batch whose longest row has ``frames``."""
        ...

    def cond_bucket(self, length: int) -> int:
        """The padded L the engine runs for conditioning of ``length`` tokens."""
        ...

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        states: torch.Tensor,
        states_mask: torch.Tensor,
        frame_mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


def round_up(n: int, multiple: int) -> int:
    return -(-max(n, 1) // multiple) * multiple


def derive_depth(engine: Engine, *, cfg: bool = True) -> int:
    """The largest pipeline depth for ``engine``: its batch ceiling, halved when guided requests
    should run positive and negative rows in one execute."""
    return max(1, engine.max_batch // 2) if cfg else engine.max_batch
