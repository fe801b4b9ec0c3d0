"""What a caller asks for, validated before it reaches the session's queue."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from .curves import Curve, is_one, is_zero

CfgType = Literal["none", "full", "self", "initialize"]
GuidanceMode = Literal["cfg", "apg"]
CFG_TYPES: tuple[str, ...] = ("none", "full", "self", "initialize")


@dataclass
class Request:
    """One generation: a ``(frames, C)`` latent denoised from seeded noise.

    Attributes:
        frames: latent length T (25 frames per second of audio with the built-in model).
        cond: positive conditioning ``(L, D)`` encoder states, ``L >= 1``; ``cond_mask`` ``(L,)``
            bool. ``cond``, ``negative``, ``init_latent`` and ``context`` must be finite.
        negative: negative conditioning for CFG (``None``: unconditional, no tokens).
        seed: noise seed (noise is drawn on the host, so a seed gives the same latent everywhere).
        steps, shift, denoise: the flow schedule (see :func:`stream_dit.schedule.flow_schedule`).
        init_latent: ``(frames, C)`` latent to start from when ``denoise < 1``.
        context: ``(frames, context_channels)`` context latents for models that take them.
        guidance: CFG/APG scale; ``cfg_type`` picks residual-CFG: ``"none"`` (no guidance),
            ``"full"`` (negative pass every step), ``"self"`` (negative from the stored initial
            noise, no pass), ``"initialize"`` (negative computed once on the first step and cached).
        guidance_mode: ``"cfg"`` or ``"apg"`` (with ``apg_momentum``, ``apg_norm_threshold``,
            ``apg_eta``); ``cfg_rescale`` blends toward the positive branch's std.
        velocity_scale, noise, guidance_curve: per-step curves (multiplier of the velocity, SDE
            noise level added after each step, multiplier of ``guidance``).
        dcw: ``(low, high)`` strengths of the Haar-band correction (``None``: off).
        stream: keep every intermediate latent for the async iterator.
        audio: decode the finished latent to audio when the session has a decoder.
    """

    frames: int
    cond: torch.Tensor
    cond_mask: torch.Tensor | None = None
    negative: torch.Tensor | None = None
    negative_mask: torch.Tensor | None = None
    seed: int = 0
    steps: int = 8
    shift: float = 1.0
    denoise: float = 1.0
    init_latent: torch.Tensor | None = None
    context: torch.Tensor | None = None
    guidance: float = 1.0
    cfg_type: CfgType = "none"
    guidance_mode: GuidanceMode = "cfg"
    cfg_rescale: float = 0.0
    apg_momentum: float = -0.5
    apg_norm_threshold: float = 0.0
    apg_eta: float = 0.0
    velocity_scale: Curve | Sequence[float] | None = None
    noise: Curve | Sequence[float] | None = None
    guidance_curve: Curve | Sequence[float] | None = None
    dcw: tuple[float, float] | None = None
    stream: bool = False
    audio: bool = True
    tag: str = field(default="", compare=False)

    def validate(
        self,
        *,
        channels: int,
        cond_dim: int,
        max_frames: int,
        max_cond_len: int,
        context_channels: int = 0,
    ) -> None:
        """Normalise curves and check every field against the model and engine limits.

        Raises:
            ValueError / TypeError naming the field and what was expected (``ValueError`` for an
            empty ``cond`` and for NaN or inf in ``cond``, ``negative``, ``init_latent`` or
            ``context``).
        """
        if not isinstance(self.frames, int) or isinstance(self.frames, bool) or self.frames < 1:
            raise ValueError(f"frames must be an int >= 1, got {self.frames!r}")
        if self.frames > max_frames:
            raise ValueError(f"frames={self.frames} exceeds the engine's limit of {max_frames}")
        if not isinstance(self.audio, bool):
            raise TypeError(f"audio must be a bool, got {type(self.audio).__name__}")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be an int >= 1, got {self.steps!r}")
        for name in (
            "shift",
            "denoise",
            "guidance",
            "cfg_rescale",
            "apg_momentum",
            "apg_norm_threshold",
            "apg_eta",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.shift <= 0:
            raise ValueError(f"shift must be > 0, got {self.shift}")
        if not 0 < self.denoise <= 1:
            raise ValueError(f"denoise must be in (0, 1], got {self.denoise}")
        if self.cfg_type not in CFG_TYPES:
            raise ValueError(f"cfg_type must be one of {CFG_TYPES}, got {self.cfg_type!r}")
        if self.guidance_mode not in ("cfg", "apg"):
            raise ValueError(f"guidance_mode must be 'cfg' or 'apg', got {self.guidance_mode!r}")
        if not 0.0 <= self.cfg_rescale <= 1.0:
            raise ValueError(f"cfg_rescale must be in [0, 1], got {self.cfg_rescale}")
        self.velocity_scale = Curve.of(self.velocity_scale, name="velocity_scale")
        self.noise = Curve.of(self.noise, name="noise")
        self.guidance_curve = Curve.of(self.guidance_curve, name="guidance_curve")
        if self.noise is not None and min(self.noise.values) < 0:
            raise ValueError("noise curve values must be >= 0")
        if self.dcw is not None:
            if len(self.dcw) != 2 or not all(math.isfinite(float(v)) for v in self.dcw):
                raise ValueError(
                    f"dcw must be a pair of finite strengths (low, high), got {self.dcw!r}"
                )
            self.dcw = (float(self.dcw[0]), float(self.dcw[1]))
        _check_states(self.cond, self.cond_mask, "cond", cond_dim, max_cond_len)
        if self.negative is not None:
            _check_states(self.negative, self.negative_mask, "negative", cond_dim, max_cond_len)
        elif self.negative_mask is not None:
            raise ValueError("negative_mask given without negative")
        if self.denoise < 1.0 and self.init_latent is None:
            raise ValueError("denoise < 1 needs init_latent, the latent to start from")
        if self.init_latent is not None:
            _check_latent(self.init_latent, "init_latent", (self.frames, channels))
        if self.context is not None:
            if not context_channels:
                raise ValueError("context was given but the model takes no context latents")
            _check_latent(self.context, "context", (self.frames, context_channels))

    @property
    def guided(self) -> bool:
        """Whether guidance changes anything (decided from host values only)."""
        if self.cfg_type == "none":
            return False
        return not (self.guidance == 1.0 and is_one(self.guidance_curve))

    @property
    def has_curves(self) -> bool:
        return not (is_one(self.velocity_scale) and is_zero(self.noise)) or self.dcw is not None


def _check_states(
    states: torch.Tensor, mask: torch.Tensor | None, name: str, cond_dim: int, max_len: int
) -> None:
    if not isinstance(states, torch.Tensor):
        raise TypeError(f"{name} must be a tensor (L, {cond_dim}), got {type(states).__name__}")
    if states.dim() != 2 or states.shape[1] != cond_dim:
        raise ValueError(f"{name} must have shape (L, {cond_dim}), got {tuple(states.shape)}")
    if not states.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {states.dtype}")
    if states.shape[0] > max_len:
        raise ValueError(f"{name} has {states.shape[0]} tokens; the engine's limit is {max_len}")
    if name == "cond" and states.shape[0] == 0:
        # an unconditional row is a request without ``negative``; a positive row needs a token
        raise ValueError(
            f"cond must hold at least one token (L >= 1), got shape {tuple(states.shape)}"
        )
    _check_finite(states, name)
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"{name}_mask must be a bool tensor")
        if tuple(mask.shape) != (states.shape[0],):
            raise ValueError(
                f"{name}_mask must have shape ({states.shape[0]},), got {tuple(mask.shape)}"
            )


def _check_latent(x: torch.Tensor, name: str, shape: tuple[int, int]) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor of shape {shape}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
    _check_finite(x, name)


def _check_finite(x: torch.Tensor, name: str) -> None:
    """Refuse NaN and inf in one of the request's own tensors.

    This reads a value back (for a CUDA tensor, a wait for its stream) each time a request is
    validated: at submit, and in the caller-side checks of
    :class:`~stream_dit.aio.AsyncStreamSession` and the HTTP server; always on the request's own
    tensor, before it is copied into the session's batched state. ``tick()``, the loop that must
    not wait for the device, never reads a value. The server's tensors are on the host.
    """
    if x.numel() == 0:
        return
    bad = int(torch.count_nonzero(~torch.isfinite(x.detach())))
    if bad:
        raise ValueError(f"{name} must be finite; {bad} of its values are NaN or infinite")
