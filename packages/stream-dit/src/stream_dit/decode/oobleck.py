"""The Oobleck VAE decoder of ACE-Step 1.5 and Stable Audio (diffusers' ``AutoencoderOobleck``) as
the session's audio decoder.

Needs the ``diffusers`` extra. :class:`OobleckAdapter` runs a copy of the VAE's decoder prepared
for inference: weight normalisation folded into plain convolution weights (diffusers recomputes
``g · v / ‖v‖`` on every call) and the Snake activations' ``exp(α)`` and ``1 / (exp(β) + 1e-9)``
computed once, with diffusers' own arithmetic so that a float32 decode equals ``vae.decode``. The
VAE passed in is not modified (its encoder and decoder keep training-time weight norms).

``build_vae("ace-step")`` is ACE-Step 1.5's published configuration (48 kHz stereo, 64 latent
channels at 25 Hz: ``downsampling_ratios=[2, 4, 4, 6, 10]``, hop 1920,
``channel_multiples=[1, 2, 4, 8, 16]``, 128 encoder and decoder channels); ``"stable-audio"`` is
Stable Audio Open 1.0's (44.1 kHz, ``[2, 4, 4, 8, 8]``, hop 2048); ``"tiny"`` runs the CPU tests.
All draw random weights: load real ones with ``AutoencoderOobleck.from_pretrained(..., subfolder=
"vae")`` and hand that model to :class:`OobleckAdapter`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

try:
    from diffusers.models.autoencoders.autoencoder_oobleck import (
        AutoencoderOobleck,
        OobleckDecoder,
        Snake1d,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the Oobleck decoder needs diffusers >= 0.42: pip install 'stream-dit[diffusers]'"
    ) from exc

from ..model.diffusers_common import resolve_preset, seeded_model
from .receptive_field import ReceptiveField, oobleck_receptive_field

__all__ = ["VAE_PRESETS", "OobleckAdapter", "VaePreset", "build_decoder", "build_vae"]


@dataclass(frozen=True)
class VaePreset:
    """Keyword arguments of ``AutoencoderOobleck`` for one configuration."""

    downsampling_ratios: tuple[int, ...]
    channel_multiples: tuple[int, ...]
    sampling_rate: int
    encoder_hidden_size: int = 128
    decoder_channels: int = 128
    decoder_input_channels: int = 64
    audio_channels: int = 2

    def kwargs(self) -> dict:
        out = dict(self.__dict__)
        out["downsampling_ratios"] = list(self.downsampling_ratios)
        out["channel_multiples"] = list(self.channel_multiples)
        return out


#: ``ace-step``: ACE-Step 1.5's ``vae/config.json`` (also the diffusers pipeline's defaults of
#: 48 kHz and a hop of 1920); ``stable-audio``: Stable Audio Open 1.0's (diffusers' defaults with
#: 44.1 kHz); ``tiny``: 8 decoder channels, hop 32 at 800 Hz (25 latent frames per second, like
#: ACE-Step), for the CPU tests and the tiny demo.
VAE_PRESETS: dict[str, VaePreset] = {
    "ace-step": VaePreset((2, 4, 4, 6, 10), (1, 2, 4, 8, 16), 48_000),
    "stable-audio": VaePreset((2, 4, 4, 8, 8), (1, 2, 4, 8, 16), 44_100),
    "tiny": VaePreset((4, 8), (1, 2), 800, encoder_hidden_size=8, decoder_channels=8),
}


@contextlib.contextmanager
def _quiet_weight_norm() -> Iterator[None]:
    """diffusers builds its convolutions with the deprecated ``torch.nn.utils.weight_norm``; its
    warning would fire on every build and says nothing a user can act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*weight_norm.*", category=FutureWarning)
        yield


class _Snake(nn.Module):
    """Diffusers' ``Snake1d`` with its per-channel constants computed once (same arithmetic)."""

    def __init__(self, snake: Snake1d) -> None:
        super().__init__()
        alpha = torch.exp(snake.alpha) if snake.logscale else snake.alpha
        beta = torch.exp(snake.beta) if snake.logscale else snake.beta
        self.register_buffer("alpha", alpha.detach().clone())
        self.register_buffer("inv_beta", (beta + 1e-9).reciprocal().detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.inv_beta * torch.sin(self.alpha * x).pow(2)


def _fold_weight_norm(module: nn.Module) -> None:
    for m in module.modules():
        if not isinstance(m, (nn.Conv1d, nn.ConvTranspose1d)):
            continue
        if hasattr(m, "weight_g"):  # torch.nn.utils.weight_norm (what diffusers uses)
            torch.nn.utils.remove_weight_norm(m)
        elif torch.nn.utils.parametrize.is_parametrized(m, "weight"):
            torch.nn.utils.parametrize.remove_parametrizations(m, "weight")


def _swap_snakes(module: nn.Module) -> None:
    for name, child in list(module.named_children()):
        if isinstance(child, Snake1d):
            setattr(module, name, _Snake(child))
        else:
            _swap_snakes(child)


class OobleckAdapter(nn.Module):
    """The decoder of an ``AutoencoderOobleck``, ready for windowed inference.

    ``forward(z)`` maps latents ``(B, latent_channels, T)`` in the decoder's dtype to audio
    ``(B, audio_channels, T · hop)``, what ``vae.decode(z).sample`` returns without tiling.

    Args:
        vae: the autoencoder (real or random weights; any device and dtype; left unchanged).

    Attributes:
        hop: audio samples per latent frame; sample_rate: audio samples per second;
        latent_channels, audio_channels; receptive_field: the :class:`ReceptiveField` of the
        decoder, from which windowed decoding derives its context.
    """

    def __init__(self, vae: AutoencoderOobleck) -> None:
        super().__init__()
        if not isinstance(vae, AutoencoderOobleck):
            raise TypeError(f"vae must be an AutoencoderOobleck, got {type(vae).__name__}")
        cfg = vae.config
        param = next(vae.decoder.parameters())
        # a fresh decoder holding a copy of the weights (a weight-normed module that has run
        # cannot be deep-copied), built on the meta device so nothing is initialised twice
        with torch.device("meta"), _quiet_weight_norm():
            decoder = OobleckDecoder(
                channels=cfg.decoder_channels,
                input_channels=cfg.decoder_input_channels,
                audio_channels=cfg.audio_channels,
                upsampling_ratios=list(cfg.downsampling_ratios)[::-1],
                channel_multiples=list(cfg.channel_multiples),
            )
        state = {k: v.detach().clone() for k, v in vae.decoder.state_dict().items()}
        decoder.load_state_dict(state, assign=True)
        _fold_weight_norm(decoder)
        _swap_snakes(decoder)
        self.decoder = decoder.to(param.device, param.dtype).eval().requires_grad_(False)
        self.receptive_field: ReceptiveField = oobleck_receptive_field(self.decoder)
        self.hop = self.receptive_field.hop
        self.sample_rate = int(cfg.sampling_rate)
        self.latent_channels = int(cfg.decoder_input_channels)
        self.audio_channels = int(cfg.audio_channels)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.decoder.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.decoder.parameters()).device

    @property
    def frame_rate(self) -> float:
        """Latent frames per second."""
        return self.sample_rate / self.hop

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(z)


def build_vae(
    preset: str | VaePreset = "ace-step",
    *,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> AutoencoderOobleck:
    """A seeded ``AutoencoderOobleck`` with random weights at a :data:`VAE_PRESETS` configuration.

    Raises:
        ValueError: for an unknown preset name. TypeError: for a preset of the wrong type.
    """
    p = resolve_preset(preset, VAE_PRESETS, VaePreset, "a VaePreset")
    with _quiet_weight_norm():
        return seeded_model(AutoencoderOobleck, p.kwargs(), seed=seed, device=device, dtype=dtype)


def build_decoder(
    preset: str | VaePreset = "ace-step",
    *,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> OobleckAdapter:
    """:class:`OobleckAdapter` of :func:`build_vae` (random weights)."""
    return OobleckAdapter(build_vae(preset, seed=seed, device=device, dtype=dtype))
