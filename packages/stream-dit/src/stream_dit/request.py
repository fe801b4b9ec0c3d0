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

#: The largest magnitude of a request's open-ended numbers (guidance, APG's eta and norm threshold,
#: curve values, DCW strengths, the top of shift): far past any useful setting, and small enough
#: that a step's arithmetic stays finite in float32 and bfloat16, where a guidance of 1e39 is
#: already inf and the latent NaN.
MAX_MAGNITUDE = 1e3
#: The largest magnitude of a value in a request's tensors (``cond``, ``negative``, ``init_latent``,
#: ``context``): encoder states and latents are of order 1-100 (a language model's rare outlier
#: features reach ~1e3), and past this a state's square overflows float32 inside the model.
MAX_STATE_MAGNITUDE = 1e4
#: The largest seed (the noise generator takes 64-bit seeds; JSON clients round past 2**53 anyway).
SEED_MAX = 2**63 - 1

#: (low, high, low included) of each number a request carries.
NUMBER_RANGES: dict[str, tuple[float, float, bool]] = {
    "shift": (0.0, MAX_MAGNITUDE, False),
    "denoise": (0.0, 1.0, False),
    "guidance": (-MAX_MAGNITUDE, MAX_MAGNITUDE, True),
    "cfg_rescale": (0.0, 1.0, True),
    "apg_momentum": (-1.0, 1.0, True),
    "apg_norm_threshold": (0.0, MAX_MAGNITUDE, True),
    "apg_eta": (-MAX_MAGNITUDE, MAX_MAGNITUDE, True),
}


@dataclass
class Request:
    """One generation: a ``(frames, C)`` latent denoised from seeded noise.

    Attributes:
        frames: latent length T (25 frames per second of audio with the built-in model).
        cond: positive conditioning ``(L, D)`` encoder states, ``L >= 1``; ``cond_mask`` ``(L,)``
            bool. ``cond``, ``negative``, ``init_latent`` and ``context`` must be finite and
            within ``±MAX_STATE_MAGNITUDE``.
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

        Ints must be ints and numbers numbers (a bool or a string is neither); every number has
        the range of :data:`NUMBER_RANGES` (open-ended ones stop at :data:`MAX_MAGNITUDE`, so a
        step's arithmetic stays finite), ``seed`` is in ``[0, 2**63 - 1]``.

        Raises:
            ValueError / TypeError naming the field and what was expected (``TypeError`` for a
            value of the wrong type, ``ValueError`` for one out of range, for an empty ``cond``
            and for NaN, inf or a magnitude past :data:`MAX_STATE_MAGNITUDE` in ``cond``,
            ``negative``, ``init_latent`` or ``context``).
        """
        _check_int("frames", self.frames, 1, max_frames, "the engine's limit")
        _check_int("steps", self.steps, 1, None)
        _check_int("seed", self.seed, 0, SEED_MAX)
        for name in ("audio", "stream"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        for name, (low, high, closed) in NUMBER_RANGES.items():
            _check_number(name, getattr(self, name), low, high, closed)
        if self.cfg_type not in CFG_TYPES:
            raise ValueError(f"cfg_type must be one of {CFG_TYPES}, got {self.cfg_type!r}")
        if self.guidance_mode not in ("cfg", "apg"):
            raise ValueError(f"guidance_mode must be 'cfg' or 'apg', got {self.guidance_mode!r}")
        self.velocity_scale = Curve.of(self.velocity_scale, name="velocity_scale")
        self.noise = Curve.of(self.noise, name="noise")
        self.guidance_curve = Curve.of(self.guidance_curve, name="guidance_curve")
        for name in ("velocity_scale", "noise", "guidance_curve"):
            curve = getattr(self, name)
            if curve is not None and max(abs(v) for v in curve.values) > MAX_MAGNITUDE:
                raise ValueError(f"{name} values must lie in [-{MAX_MAGNITUDE:g}, "
                                 f"{MAX_MAGNITUDE:g}], got {list(curve.values)}")  # fmt: skip
        if self.noise is not None and min(self.noise.values) < 0:
            raise ValueError("noise curve values must be >= 0")
        if self.dcw is not None:
            if isinstance(self.dcw, (str, bytes)) or len(self.dcw) != 2:
                raise ValueError(f"dcw must be a pair of strengths (low, high), got {self.dcw!r}")
            for name, v in zip(("dcw[0]", "dcw[1]"), self.dcw):
                _check_number(name, v, -MAX_MAGNITUDE, MAX_MAGNITUDE, True)
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


def _check_int(name: str, value, low: int, high: int | None, high_is: str = "") -> None:
    """An int (not a bool, not a string) in ``[low, high]``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if high is not None and value > high:
        limit = f"{high_is} of {high}" if high_is else f"{high}"
        raise ValueError(f"{name}={value} exceeds {limit}")


def _check_number(name: str, value, low: float, high: float, low_included: bool) -> None:
    """A finite int or float (not a bool, not a string) in ``[low, high]`` (``(low, high]``
    when ``low`` is excluded)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    inside = (low <= value if low_included else low < value) and value <= high
    if not math.isfinite(value) or not inside:
        span = f"{'[' if low_included else '('}{low:g}, {high:g}]"
        raise ValueError(f"{name} must be a finite number in {span}, got {value!r}")


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
    """Refuse NaN and inf in one of the request's own tensors, and values past
    :data:`MAX_STATE_MAGNITUDE`.

    This reads a value back (for a CUDA tensor, a wait for its stream) each time a request is
    validated: at submit, and in the caller-side checks of
    :class:`~stream_dit.aio.AsyncStreamSession` and the HTTP server; always on the request's own
    tensor, before it is copied into the session's batched state. ``tick()``, the loop that must
    not wait for the device, never reads a value. The server's tensors are on the host.
    """
    if x.numel() == 0:
        return
    x = x.detach()
    bad = int(torch.count_nonzero(~torch.isfinite(x)))
    if bad:
        raise ValueError(f"{name} must be finite; {bad} of its values are NaN or infinite")
    largest = float(x.abs().amax())
    if largest > MAX_STATE_MAGNITUDE:
        raise ValueError(
            f"{name} values must lie in [-{MAX_STATE_MAGNITUDE:g}, {MAX_STATE_MAGNITUDE:g}], "
            f"got one of magnitude {largest:g}"
        )
