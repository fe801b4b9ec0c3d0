"""How to build the session a server serves, as plain values.

``stream-dit serve`` builds its one session from a :class:`SessionSpec`, and every Ray Serve
replica (:mod:`stream_dit.ray`) builds its own from the same spec, sent to it as a value: the
weights come from the spec's seed, so every replica holds the same model and answers a request
(and its seed) with the same output as the single-process server.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from .session import StreamSession

__all__ = ["SessionSpec", "build_session", "warmup_of"]


@dataclass(frozen=True)
class SessionSpec:
    """A session's model, engine, decoder and warm-up (the ``stream-dit serve`` flags of the
    same names; ``None`` picks the flag's default).

    Attributes:
        model, preset, seed: the denoiser (:func:`stream_dit.model.build_denoiser`).
        device, dtype: where it runs (``dtype`` ``None``: bfloat16 on CUDA, float32 elsewhere).
        depth, max_queue: requests denoised at once, and waiting for a slot.
        max_frames, max_cond_len: the engine's limits; ``engine_mode``: its mode.
        vae, decoder_mode, decode_window, decode_context, decode_crossfade, decode_align,
        decode_batch: the audio decoder (:func:`stream_dit.decode.registry.build_audio_decoder`).
        warmup, warmup_frames, warmup_cond_len: warm the engine up before serving, at these
            frame counts and conditioning lengths (``None``: the engine's limits).
    """

    model: str = "dit"
    preset: str | None = "tiny"
    seed: int = 0
    device: str = "cpu"
    dtype: str | None = None
    depth: int = 4
    max_queue: int = 64
    max_frames: int = 750
    max_cond_len: int = 128
    engine_mode: str = "auto"
    vae: str = "auto"
    decoder_mode: str = "auto"
    decode_window: int | None = None
    decode_context: int | None = None
    decode_crossfade: int = 1
    decode_align: int = 16
    decode_batch: int = 1
    warmup: bool = True
    warmup_frames: tuple[int, ...] | None = None
    warmup_cond_len: tuple[int, ...] | None = None

    @classmethod
    def from_values(cls, values: Any) -> SessionSpec:
        """The spec of the fields of ``values`` (an ``argparse.Namespace`` or a mapping) that
        name a field of the spec; the others are ignored."""
        get = values.get if isinstance(values, dict) else lambda k, d: getattr(values, k, d)
        picked = {}
        for f in fields(cls):
            value = get(f.name, None)
            if value is None:
                continue
            if f.name in ("warmup_frames", "warmup_cond_len"):
                value = tuple(int(v) for v in value)
            picked[f.name] = value
        return cls(**picked)

    def with_device(self, device: str) -> SessionSpec:
        """The same spec on ``device``."""
        return replace(self, device=device)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype or ("bfloat16" if self.on_cuda else "float32"))

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")


def build_session(spec: SessionSpec) -> StreamSession:
    """The session of ``spec`` (not warmed up).

    Raises:
        ValueError, TypeError, ImportError: a bad setting, or a decoder whose extra is missing;
            bad warm-up shapes are refused here too, not when the warm-up runs.
    """
    from .decode.registry import build_audio_decoder
    from .engines import TorchEngine
    from .model import build_denoiser
    from .warmup import forward_shapes

    dtype = spec.torch_dtype
    model = build_denoiser(spec.model, spec.preset, seed=spec.seed, device=spec.device, dtype=dtype)
    engine = TorchEngine(
        model,
        max_batch=2 * spec.depth,
        max_frames=spec.max_frames,
        max_cond_len=spec.max_cond_len,
        mode=spec.engine_mode,
    )
    decoder = build_audio_decoder(
        spec.vae,
        model=spec.model,
        preset=spec.preset,
        seed=spec.seed,
        device=spec.device,
        dtype=dtype,
        mode=spec.decoder_mode,
        window=spec.decode_window,
        context=spec.decode_context,
        crossfade=spec.decode_crossfade,
        window_align=spec.decode_align,
        batch_windows=spec.decode_batch,
        latent_channels=model.latent_channels,
    )
    session = StreamSession(
        model, engine, depth=spec.depth, max_queue=spec.max_queue, decoder=decoder
    )
    if spec.warmup:
        forward_shapes(session, frames=spec.warmup_frames, cond_lens=spec.warmup_cond_len)
    return session


def warmup_of(spec: SessionSpec) -> Callable[[StreamSession], Any] | None:
    """The warm-up of ``spec`` (``None`` when it has none): runs :func:`stream_dit.warmup.warmup`
    at the spec's shapes, prints its one-line report to stderr and returns it."""
    if not spec.warmup:
        return None

    def warm(session: StreamSession) -> Any:
        from .warmup import warmup

        report = warmup(session, frames=spec.warmup_frames, cond_lens=spec.warmup_cond_len)
        print(report, file=sys.stderr, flush=True)
        return report

    return warm
