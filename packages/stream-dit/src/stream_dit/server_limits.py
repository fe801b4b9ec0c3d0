"""What the HTTP server accepts: every size bound in one place, checked before anything is allocated.

A request body is parsed into plain Python values (its size already capped by ``max_body_bytes``),
then :meth:`ServerLimits.check` bounds every size-bearing field against these limits before a single
tensor is made, so an oversized request costs a few microseconds and a 400, never memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: JSON characters budgeted per number when the body cap is derived from the limits
#: (``-0.12345678901234567,`` is 21 characters; a little slack for whitespace).
_CHARS_PER_NUMBER = 24
_BODY_SLACK = 16 * 1024


@dataclass(frozen=True)
class ServerLimits:
    """Bounds of the HTTP server (``stream-dit serve`` flags of the same names).

    Attributes:
        max_frames, max_cond_len: largest ``frames`` and conditioning length (``cond``, ``negative``
            rows, ``cond_len``); at most the engine's own limits.
        cond_dim: width of a conditioning row (the model's).
        max_steps: largest ``steps``.
        max_curve_len: most values in ``velocity_scale``, ``noise`` and ``guidance_curve``.
        max_body_bytes: request-body cap (413 beyond it); derived from the limits above when not set.
        slots: requests denoised at once (the session's depth).
        max_queue: requests allowed to wait for a slot; beyond ``slots + max_queue`` in flight a
            request is answered 503 with ``Retry-After``.
        request_timeout_s: wall-clock limit of one request, body upload and queueing included
            (504 and the request is cancelled).
        retry_after_s: the ``Retry-After`` value of a 503.
        max_uploads: request bodies received at once (a request beyond it waits for a place,
            within ``request_timeout_s``, so that it is still validated before any 503); with
            ``max_body_bytes`` it bounds the memory that bodies in transit take under a flood.
            Default (0): ``slots + max_queue``.
        channels: latent channels C of the model (the width of an ``init_latent`` row; 0:
            unknown, rows unchecked here).
    """

    max_frames: int
    max_cond_len: int
    cond_dim: int
    slots: int
    max_queue: int
    max_steps: int = 1000
    max_curve_len: int = 1024
    max_body_bytes: int = 0
    request_timeout_s: float = 300.0
    retry_after_s: int = 1
    max_uploads: int = 0
    channels: int = 0

    def __post_init__(self) -> None:
        for name in ("max_frames", "max_cond_len", "cond_dim", "slots", "max_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "max_queue",
            "max_curve_len",
            "max_body_bytes",
            "retry_after_s",
            "max_uploads",
            "channels",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not (self.request_timeout_s > 0 and math.isfinite(self.request_timeout_s)):
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.max_body_bytes == 0:
            numbers = (
                2 * self.max_cond_len * self.cond_dim
                + self.max_frames * self.channels  # init_latent
                + 3 * self.max_curve_len
            )
            object.__setattr__(self, "max_body_bytes", numbers * _CHARS_PER_NUMBER + _BODY_SLACK)
        if self.max_uploads == 0:
            object.__setattr__(self, "max_uploads", self.slots + self.max_queue)

    @classmethod
    def for_session(cls, session: Any, **overrides: Any) -> ServerLimits:
        """Limits of a server in front of ``session``: the engine's limits unless set lower.

        Raises:
            ValueError: an override above the engine's limit, or an unknown name.
        """
        engine = session.engine
        ceilings = {"max_frames": engine.max_frames, "max_cond_len": engine.max_cond_len}
        values: dict[str, Any] = {
            **ceilings,
            "cond_dim": session.cond_dim,
            "channels": session.channels,
            "slots": session.depth,
            "max_queue": session.max_queue,
        }
        unknown = set(overrides) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown server limits: {sorted(unknown)}")
        for name, value in overrides.items():
            if value is None:
                continue
            if name in ceilings and value > ceilings[name]:
                raise ValueError(
                    f"{name}={value} exceeds the engine's limit of {ceilings[name]}; "
                    "build the engine with a larger limit"
                )
            values[name] = value
        return cls(**values)

    @property
    def capacity(self) -> int:
        """Requests in flight (in a slot or waiting) before new ones are answered 503."""
        return self.slots + self.max_queue

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check(self, body: Any) -> None:
        """Bound every size-bearing field of a parsed request body; allocates nothing.

        Raises:
            ValueError naming the field, the value and the limit.
        """
        _at_most("frames", body.frames, self.max_frames)
        _at_most("steps", body.steps, self.max_steps)
        if body.cond is None and body.cond_seed is None:
            raise ValueError("give cond (a list of L rows of D numbers) or cond_seed")
        if body.cond is None:
            _at_most("cond_len", body.cond_len, self.max_cond_len)
        for name in ("cond", "negative"):
            rows = getattr(body, name)
            if rows is not None:
                self._check_rows(name, rows)
        latent = getattr(body, "init_latent", None)
        if latent is not None:
            _at_most("init_latent length (rows)", len(latent), self.max_frames)
            widths = {len(row) for row in latent}
            if len(widths) > 1 or (self.channels and widths - {self.channels}):
                raise ValueError(
                    f"init_latent must have shape (frames, {self.channels or 'C'}); its rows "
                    f"have {sorted(widths)} numbers"
                )
        for name in ("velocity_scale", "noise", "guidance_curve"):
            curve = getattr(body, name)
            if curve is not None:
                _at_most(f"{name} length", len(curve), self.max_curve_len)

    def _check_rows(self, name: str, rows: Sequence[Sequence[float]]) -> None:
        _at_most(f"{name} length (rows)", len(rows), self.max_cond_len)
        for i, row in enumerate(rows):
            if len(row) != self.cond_dim:
                raise ValueError(
                    f"{name} must have shape (L, {self.cond_dim}); row {i} has {len(row)} numbers"
                )


def _at_most(name: str, value: int, limit: int) -> None:
    if value > limit:
        raise ValueError(f"{name}={value} exceeds the server's limit of {limit}")
