"""What an HTTP front needs to know of a session without holding it: the model's and engine's
shapes (to validate a request) and the decoder's audio format (to write a WAV header).

A single server reads them from its own session; a Ray Serve ingress, which holds no model, gets
them from a replica once (they are plain values, so they travel between processes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["AudioFormat", "SessionFacts"]


@dataclass(frozen=True)
class AudioFormat:
    """The decoder's output: ``hop`` samples per latent frame, ``audio_channels`` channels."""

    sample_rate: int
    hop: int
    audio_channels: int


@dataclass(frozen=True)
class SessionFacts:
    """The shapes a request is validated against (see :meth:`stream_dit.Request.validate`).

    Attributes:
        channels: latent channels C of the model.
        cond_dim: width D of a conditioning row.
        max_frames, max_cond_len: the engine's limits.
        context_channels: channels of the context latents the model takes (0: none).
        audio: the decoder's output format, ``None`` without a decoder.
    """

    channels: int
    cond_dim: int
    max_frames: int
    max_cond_len: int
    context_channels: int = 0
    audio: AudioFormat | None = None

    @classmethod
    def of(cls, session: Any) -> SessionFacts:
        """The facts of a :class:`~stream_dit.session.StreamSession`."""
        decoder = session.decoder
        audio = None
        if decoder is not None:
            audio = AudioFormat(
                sample_rate=int(decoder.sample_rate),
                hop=int(decoder.hop),
                audio_channels=int(decoder.audio_channels),
            )
        return cls(
            channels=session.channels,
            cond_dim=session.cond_dim,
            max_frames=session.engine.max_frames,
            max_cond_len=session.engine.max_cond_len,
            context_channels=session.context_channels,
            audio=audio,
        )

    def validation_shapes(self) -> dict[str, int]:
        """Keyword arguments of :meth:`stream_dit.Request.validate`."""
        return {
            "channels": self.channels,
            "cond_dim": self.cond_dim,
            "max_frames": self.max_frames,
            "max_cond_len": self.max_cond_len,
            "context_channels": self.context_channels,
        }
