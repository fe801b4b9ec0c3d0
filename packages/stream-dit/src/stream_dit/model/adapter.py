"""The contract between the runtime and a denoiser: one batched velocity prediction."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class DenoiserAdapter(Protocol):
    """A flow-matching denoiser the session can drive.

    ``forward(x, t, states, states_mask, frame_mask=None, context=None)`` takes

    * ``x`` ``(B, T, C)`` noisy latents at times ``t`` ``(B,)`` in ``[0, 1]`` (1 = pure noise),
    * ``states`` ``(B, L, D)`` padded encoder states with ``states_mask`` ``(B, L)`` bool (True =
      a real token; a row may have none, which means "unconditional"),
    * ``frame_mask`` ``(B, T)`` bool, True on the frames that belong to the row (``None``: all),
    * ``context`` ``(B, T, context_channels)`` optional context latents,

    and returns the velocity ``dx/dt`` ``(B, T, C)`` in float32. Rows are independent: a row's
    output must not depend on the other rows of the batch (the runtime relies on it to batch
    unrelated requests and to split CFG into two passes).

    An adapter whose ``forward`` also takes ``conditioned_rows=k`` (a promise that the rows
    from ``k`` on have no conditioning tokens) says so with a true ``takes_conditioned_rows``
    attribute; :class:`~stream_dit.engines.TorchEngine` passes it on only then.
    """

    latent_channels: int
    cond_dim: int
    context_channels: int

    def __call__(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        states: torch.Tensor,
        states_mask: torch.Tensor,
        frame_mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


def check_conditioned_rows(conditioned_rows: int | None, rows: int) -> None:
    """The ``conditioned_rows`` promise of a batch of ``rows``: ``None`` or an int in
    ``[0, rows]`` (a ``ValueError`` naming it otherwise)."""
    if conditioned_rows is None:
        return
    if (
        isinstance(conditioned_rows, bool)
        or not isinstance(conditioned_rows, int)
        or not 0 <= conditioned_rows <= rows
    ):
        raise ValueError(
            f"conditioned_rows must be an int in [0, {rows}] or None, got {conditioned_rows!r}"
        )
