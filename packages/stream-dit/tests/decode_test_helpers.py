"""Tiny Oobleck VAEs for the decoder tests (CPU, a few milliseconds per decode)."""

from __future__ import annotations

import torch

from stream_dit.decode.oobleck import OobleckAdapter, VaePreset, build_vae

#: two upsampling blocks, hop 32, receptive field 312 samples = 10 frames
TINY = "tiny"
#: three blocks, hop 24 (odd-free strides), 4 latent channels: a second geometry
THREE_BLOCKS = VaePreset(
    (2, 2, 6), (1, 2, 2), 600, encoder_hidden_size=4, decoder_channels=4, decoder_input_channels=4
)


def tiny_decoder(preset=TINY, seed: int = 0) -> tuple[torch.nn.Module, OobleckAdapter]:
    vae = build_vae(preset, seed=seed)
    return vae, OobleckAdapter(vae)


def full_decode(adapter: OobleckAdapter, latent_tc: torch.Tensor) -> torch.Tensor:
    """The whole ``(T, C)`` latent in one decoder call: ``(channels, T · hop)`` float32."""
    with torch.no_grad():
        return adapter(latent_tc.t()[None].to(adapter.dtype))[0].float()
