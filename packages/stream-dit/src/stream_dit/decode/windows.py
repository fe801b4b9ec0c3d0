"""Overlapping windows over a latent and the crossfaded stitch of their decoded audio.

A latent of ``T`` frames is cut into windows of ``L = min(window, T)`` frames, every one the same
length so that windows of many requests batch into one decoder call (and one CUDA graph). With
``align``, ``L`` is instead the shortest multiple of ``align`` (at most ``window``) that needs no
more windows: a 60 s latent of 1500 frames in windows of 256 is 7 × 240 frames instead of 7 × 256,
6 % less work, and lengths stay few (one CUDA graph per multiple of ``align``). Window
``k`` starts at ``k · stride`` with ``stride = L − 2·context − crossfade``; the last one is moved
back to end at ``T`` instead of being shortened. A window's output is kept only ``context`` frames
away from each edge that is not an edge of the latent: with ``context`` at least the decoder's
receptive field (:meth:`ReceptiveField.context_frames`), that kept part equals the full decode.
Two neighbours' kept parts overlap by at least ``crossfade`` frames; the audio crosses from one to
the other linearly over the last ``crossfade`` frames of the earlier one's kept part (a hard cut
when ``crossfade`` is 0). Every output sample therefore comes from exact windows, and the crossfade
only matters when ``context`` is set below the receptive field to save compute.

Memory is bounded by the window, not the audio: a decoder call sees ``windows × L`` frames.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Stitcher", "WindowPlan", "decode_windowed", "plan_windows", "window_lengths"]


@dataclass(frozen=True)
class WindowPlan:
    """Where the windows of one latent lie, in latent frames.

    Attributes:
        frames: the latent's length T; length: every window's length ``min(window, T)``.
        context, crossfade: as asked (``crossfade`` is 0 for a single window).
        starts: first frame of each window.
        seams: for each window but the last, the frame where the next one takes over; the
            crossfade runs over ``[seam − crossfade, seam)``.
    """

    frames: int
    length: int
    context: int
    crossfade: int
    starts: tuple[int, ...]
    seams: tuple[int, ...]

    @property
    def windows(self) -> int:
        return len(self.starts)

    def final_frames(self, k: int) -> int:
        """Frames of audio that are final once windows ``0..k`` are decoded (the rest waits for
        the crossfade into window ``k + 1``)."""
        if k >= self.windows - 1:
            return self.frames
        return self.seams[k] - self.crossfade


def plan_windows(
    frames: int, window: int, context: int, crossfade: int = 0, *, align: int = 0
) -> WindowPlan:
    """The :class:`WindowPlan` of a latent of ``frames`` frames.

    ``align = 0`` keeps every window at ``min(window, frames)`` frames; ``align > 0`` shortens them
    to the shortest multiple of ``align`` that covers the latent in as many windows.

    Raises:
        ValueError: a non-positive ``frames`` or ``window``, a negative ``context``,
            ``crossfade`` or ``align``, or a window too short to keep anything (``window <=
            2·context + crossfade``).
    """
    for name, value, low in (
        ("frames", frames, 1),
        ("window", window, 1),
        ("context", context, 0),
        ("crossfade", crossfade, 0),
        ("align", align, 0),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    stride = window - 2 * context - crossfade
    if stride < 1:
        raise ValueError(
            f"window={window} must exceed 2·context + crossfade = {2 * context + crossfade} "
            "(each window keeps window − 2·context − crossfade new frames)"
        )
    if frames <= window:
        return WindowPlan(frames, frames, context, 0, (0,), ())
    overlap = 2 * context + crossfade
    count = 1 + -(-(frames - window) // stride)
    if align:
        # n windows of length L cover T frames when (n − 1)(L − overlap) + L >= T
        shortest = -(-(frames + (count - 1) * overlap) // count)
        window = min(window, -(-shortest // align) * align)
        stride = window - overlap
    starts = [k * stride for k in range(count - 1)] + [frames - window]
    # window k keeps [start + context, start + window − context) away from the latent's edges;
    # the next one takes over at the end of that, after the crossfade
    seams = tuple(s + window - context for s in starts[:-1])
    return WindowPlan(frames, window, context, crossfade, tuple(starts), seams)


def window_lengths(window: int, align: int = 0) -> tuple[int, ...]:
    """Every window length :func:`plan_windows` gives latents longer than ``window`` (the lengths
    worth a CUDA graph); shorter latents are one window of their own length."""
    if not align:
        return (window,)
    return tuple(sorted({*range(align, window + 1, align), window}))


class Stitcher:
    """Puts a plan's decoded windows, given in order, together into final audio pieces.

    ``add(k, audio)`` takes window ``k``'s decoded ``(channels, length · hop)`` audio and returns
    the audio it makes final, ``(channels, n)`` float32: samples ``[final(k−1), final(k))`` of the
    whole, where ``final(k) = plan.final_frames(k) · hop``. It keeps only the crossfade tail
    between calls.
    """

    def __init__(self, plan: WindowPlan, hop: int) -> None:
        self.plan, self.hop = plan, hop
        self.done = 0  # samples handed out
        self._tail: torch.Tensor | None = None  # the previous window's crossfade region
        self._ramps: dict[tuple, torch.Tensor] = {}

    def _ramp(self, n: int, like: torch.Tensor) -> torch.Tensor:
        key = (n, like.device)
        ramp = self._ramps.get(key)
        if ramp is None:
            ramp = (torch.arange(n, device=like.device, dtype=torch.float32) + 0.5) / n
            self._ramps[key] = ramp
        return ramp

    def add(self, k: int, audio: torch.Tensor) -> torch.Tensor:
        plan, hop = self.plan, self.hop
        start = plan.starts[k] * hop
        end = plan.final_frames(k) * hop
        audio = audio.float()
        piece = audio[:, self.done - start : end - start]
        if self._tail is not None:
            n = self._tail.shape[-1]
            w = self._ramp(n, audio)
            blend = torch.lerp(self._tail, piece[:, :n], w)
            piece = torch.cat([blend, piece[:, n:]], dim=-1)
        if k < plan.windows - 1 and plan.crossfade:
            seam = plan.seams[k] * hop
            # a copy: the audio may be an engine's output buffer, overwritten by its next call
            self._tail = audio[:, end - start : seam - start].clone()
        else:
            self._tail = None
        self.done = end
        return piece


def decode_windowed(
    decode: Callable[[torch.Tensor], torch.Tensor],
    latent: torch.Tensor,
    *,
    hop: int,
    window: int,
    context: int,
    crossfade: int = 0,
    batch: int = 1,
    align: int = 0,
) -> torch.Tensor:
    """Decode one ``(latent_channels, T)`` latent window by window, ``batch`` windows per call of
    ``decode`` (``(B, C, L) -> (B, channels, L · hop)``), into ``(channels, T · hop)`` float32.

    The plain form of what :class:`~stream_dit.decode.AudioDecoder` does inside a session (no
    streams, no batching across latents): the reference of the tests and the benchmark.
    """
    if latent.dim() != 2:
        raise ValueError(f"latent must be (latent_channels, T), got shape {tuple(latent.shape)}")
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    plan = plan_windows(latent.shape[1], window, context, crossfade, align=align)
    stitch = Stitcher(plan, hop)
    pieces = []
    for first in range(0, plan.windows, batch):
        ks = range(first, min(first + batch, plan.windows))
        z = torch.stack([latent[:, plan.starts[k] : plan.starts[k] + plan.length] for k in ks])
        out = decode(z)
        pieces += [stitch.add(k, out[i]) for i, k in enumerate(ks)]
    return torch.cat(pieces, dim=-1)
