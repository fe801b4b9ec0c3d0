"""A submitted request's handle and its status: what callers of the session, its decoder stage
and the server hold (a module of its own, so the decoder stage needs nothing of the session)."""

from __future__ import annotations

import enum
from collections.abc import Callable

import torch

from .request import Request


class QueueFullError(RuntimeError):
    """The session's queue is at capacity; retry after a tick (back-pressure)."""


class Status(str, enum.Enum):
    QUEUED = "queued"
    ACTIVE = "active"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Handle:
    """A submitted request: its status, progress and, once done, its ``(T, C)`` latent.

    In a session with a decoder, ``status`` turns ``DONE`` when the latent is final and the
    audio follows: ``audio`` is a ``(channels, T · hop)`` float32 host tensor whose first
    ``audio_samples`` samples are final (listeners are called as it grows), ``audio_done`` says
    all of it is, ``audio_error`` holds why decoding failed or stopped.
    """

    def __init__(self, request: Request, ident: int) -> None:
        self.request = request
        self.id = ident
        self.status = Status.QUEUED
        self.result: torch.Tensor | None = None
        self.error: BaseException | None = None
        self.step = 0
        self.steps = 0
        self.intermediates: list[torch.Tensor] = []
        self._listeners: list[Callable[[Handle], None]] = []
        self._cancel_requested = False
        self.audio: torch.Tensor | None = None
        self.audio_samples = 0
        self.audio_error: BaseException | None = None

    @property
    def finished(self) -> bool:
        return self.status in (Status.DONE, Status.FAILED, Status.CANCELLED)

    @property
    def audio_done(self) -> bool:
        """Whether the whole audio is final (``False`` without a decoder)."""
        return self.audio is not None and self.audio_samples == self.audio.shape[-1]

    @property
    def audio_pending(self) -> bool:
        """Whether audio is still being decoded (neither done nor failed)."""
        return self.audio is not None and not self.audio_done and self.audio_error is None

    def cancel(self) -> None:
        """Ask for cancellation; a queued request leaves at once, an active one at the next tick,
        and audio still being decoded stops at the next decoder step."""
        if not self.finished or self.audio_pending:
            self._cancel_requested = True

    def add_listener(self, fn: Callable[[Handle], None]) -> None:
        """Call ``fn(handle)`` after every step and when the request ends."""
        self._listeners.append(fn)

    def _notify(self) -> None:
        for fn in list(self._listeners):
            fn(self)

    def __repr__(self) -> str:
        return f"Handle(id={self.id}, status={self.status.value}, step={self.step}/{self.steps})"
