"""Stable Audio Open's transformer from diffusers (``StableAudioDiTModel``) as a session denoiser.

Needs the ``diffusers`` extra. The adapter runs the real modules of the diffusers model (Gaussian
Fourier time projection and its MLP, global and cross-attention projections, the 1x1 pre/post
convolutions, ``proj_in``/``proj_out``, the transformer blocks) on contiguous ``(B, T, C)`` tokens;
the diffusers forward takes ``(B, C, T)``.

Time and prediction: the model is a v-prediction model on the variance-preserving trigonometric
path ``x_τ = cos(πτ/2)·x0 + sin(πτ/2)·ε`` with ``τ ∈ [0, 1]`` its timestep input, which is what
``CosineDPMSolverMultistepScheduler`` feeds it (``τ = atan(σ)·2/π``, input scaled by
``c_in = 1/sqrt(σ² + 1)``, ``x0 = c_skip·x + c_out·v`` with ``σ_data = 1``). The session instead
integrates the rectified-flow ODE ``x_t = (1 − t)·x0 + t·ε`` (``t = 1`` noise) with Euler steps on
``dx/dt = ε − x0``. The adapter maps between the two exactly (a change of variables, no
retraining assumption): with ``r = sqrt((1 − t)² + t²)``, ``φ = atan2(t, 1 − t)``,

* the model sees ``x / r`` (the same point on the VP path) at timestep ``τ = 2φ/π``,
* its output ``v`` gives ``x0 = cos φ·x/r − sin φ·v`` and ``ε = sin φ·x/r + cos φ·v``, and the
  adapter returns ``dx/dt = ε − x0 = (sin φ − cos φ)·x/r + (cos φ + sin φ)·v``.

So ``t = 0.5`` is ``σ = 1``, ``t = 1`` is ``τ = 1`` (``σ = ∞``), and the session's Euler on its
own (shifted) flow schedule is a deterministic sampler of the model's probability-flow ODE. It is
not the pipeline's sampler: ``StableAudioPipeline`` runs ``CosineDPMSolverMultistepScheduler``
(stochastic DPM-Solver++ 2M from ``σ_max = 500`` to ``σ_min = 0.3``), so results differ from the
pipeline's for the same noise. CFG on ``dx/dt`` equals CFG on ``v`` (the map is affine in ``v``
with the same ``x`` on both branches).

Conditioning:

* ``states`` are the ``encoder_hidden_states`` of cross-attention (``cross_attention_input_dim``
  wide, 768 at the published size; the pipeline passes its T5 tokens followed by the two duration
  tokens). Padded tokens are masked out of cross-attention. The pipeline itself does not mask: it
  zeroes padded T5 tokens and attends to them, so a caller who wants that passes them as real.
* ``global_hidden_states`` (``global_states_input_dim`` wide, the pipeline's seconds-start and
  seconds-end embeddings side by side) are derived from the request: the mean of its real
  encoder states, tiled to the global width (``[mean, mean]`` at the published size; the width
  must be a multiple of ``cond_dim``). The projected global token is prepended to the sequence with
  the time embedding added, as the diffusers forward does.
* a row without conditioning tokens (the unconditional branch of CFG) gets the pipeline's null
  condition: zero encoder states (the projections have no bias, so cross-attention adds exactly
  zero, whatever their number) and a zero global vector.
* rotary embedding: the pipeline's table over ``T + 1`` positions (global token first),
  ``head_dim // 2`` rotary channels, rotate-half layout.

What batching adds: padded frames are masked out of self-attention keys (the global token is
always real) and padded states out of cross-attention keys, so a row of a padded batch computes
what the request computes alone; the adapter drives the blocks itself with 4-D boolean key masks
through :class:`~stream_dit.model.stable_audio_attention.NativeStableAudioAttnProcessor`. The
model has no context input (``context_channels = 0``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

try:
    from diffusers.models.embeddings import get_1d_rotary_pos_embed
    from diffusers.models.transformers.stable_audio_transformer import StableAudioDiTModel

    from .diffusers_common import resolve_preset, seeded_model
    from .stable_audio_attention import diffusers_processors, use_native_processor
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the Stable Audio adapter needs diffusers >= 0.42: pip install 'stream-dit[diffusers]'"
    ) from exc

#: Latent frames per second of Stable Audio Open 1.0 (44.1 kHz, VAE downsampling 2048).
STABLE_AUDIO_FRAME_RATE = 44100 / 2048


@dataclass(frozen=True)
class StableAudioPreset:
    """Keyword arguments of ``StableAudioDiTModel`` for one size."""

    in_channels: int
    num_layers: int
    attention_head_dim: int
    num_attention_heads: int
    num_key_value_attention_heads: int
    cross_attention_dim: int
    time_proj_dim: int
    global_states_input_dim: int
    cross_attention_input_dim: int
    sample_size: int = 1024

    def kwargs(self) -> dict:
        return {**self.__dict__, "out_channels": self.in_channels}


#: ``published`` is Stable Audio Open 1.0's DiT (the diffusers defaults: 1536 wide, 24 layers,
#: 24 heads / 12 KV heads of 64, 64 latent channels, 768-wide cross-attention, 1536-wide global
#: states); ``tiny`` runs the CPU tests.
STABLE_AUDIO_PRESETS: dict[str, StableAudioPreset] = {
    "tiny": StableAudioPreset(8, 2, 16, 4, 2, 32, 32, 64, 32),
    "published": StableAudioPreset(64, 24, 64, 24, 12, 768, 256, 1536, 768),
}


def flow_to_model(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For flow times ``t`` (float32): (input scale ``1/r``, model timestep ``τ``, angle ``φ``)."""
    phi = torch.atan2(t, 1.0 - t)
    return torch.rsqrt((1.0 - t) ** 2 + t**2), phi * (2.0 / math.pi), phi


class StableAudioAdapter(nn.Module):
    """A :class:`~stream_dit.model.DenoiserAdapter` around ``StableAudioDiTModel``.

    Args:
        transformer: the diffusers model (eval mode; any dtype and device). Its attention
            processors are replaced by the native one (same arithmetic, takes key masks).
    """

    context_channels = 0

    def __init__(self, transformer: StableAudioDiTModel) -> None:
        super().__init__()
        if not isinstance(transformer, StableAudioDiTModel):
            raise TypeError(
                f"transformer must be a StableAudioDiTModel, got {type(transformer).__name__}"
            )
        cfg = transformer.config
        if cfg.out_channels != cfg.in_channels:
            raise ValueError(
                f"in_channels={cfg.in_channels} and out_channels={cfg.out_channels} must match"
            )
        self.cond_dim = int(cfg.cross_attention_input_dim)
        if cfg.global_states_input_dim % self.cond_dim:
            raise ValueError(
                f"global_states_input_dim={cfg.global_states_input_dim} must be a multiple of "
                f"cross_attention_input_dim={self.cond_dim} (the global vector tiles the mean state)"
            )
        self.transformer = transformer
        self.latent_channels = int(cfg.in_channels)
        self.global_repeats = int(cfg.global_states_input_dim) // self.cond_dim
        self.rotary_dim = int(cfg.attention_head_dim) // 2
        use_native_processor(transformer)

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.dtype

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        states: torch.Tensor,
        states_mask: torch.Tensor,
        frame_mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
    ) -> torch.Tensor:
        m = self.transformer
        dtype = self.dtype
        b = x.shape[0]

        scale, tau, phi = flow_to_model(t.float())
        x_vp = x.float() * scale[:, None, None]
        temb = m.timestep_proj(m.time_proj(tau.to(dtype)))

        # global vector: the mean of the row's real states, tiled; zero for an unconditional row
        states_mask = states_mask.to(torch.bool)
        keep = states_mask[..., None].float()
        count = keep.sum(dim=1)
        mean = (states.float() * keep).sum(dim=1) / count.clamp_min(1.0)
        glob = m.global_proj(mean.repeat(1, self.global_repeats).to(dtype)) + temb
        # an unconditional row attends to one zero token (zero keys and values: output 0)
        empty = ~states_mask.any(dim=1)
        states = states.to(dtype) * states_mask[..., None].to(dtype)
        cross_mask = torch.cat([states_mask[:, :1] | empty[:, None], states_mask[:, 1:]], dim=1)
        encoder = m.cross_attention_proj(states)

        # the 1x1 pre-convolution as a Linear over channels keeps the tokens contiguous (B, T, C)
        h = x_vp.to(dtype)
        h = h + F.linear(h, m.preprocess_conv.weight[:, :, 0])
        hidden = torch.cat([glob[:, None], m.proj_in(h)], dim=1)

        # the pipeline's rotary table over T + 1 positions, positions derived from the tokens
        positions = torch.ones_like(hidden[0, :, 0], dtype=torch.float32).cumsum(0) - 1.0
        rotary = get_1d_rotary_pos_embed(
            self.rotary_dim, positions, use_real=True, repeat_interleave_real=False
        )
        self_mask = None
        if frame_mask is not None:
            real = torch.cat([frame_mask.new_ones(b, 1), frame_mask], dim=1).to(torch.bool)
            self_mask = real[:, None, None, :]
        cross_mask = cross_mask[:, None, None, :]

        for block in m.transformer_blocks:
            hidden = block(
                hidden_states=hidden,
                attention_mask=self_mask,
                encoder_hidden_states=encoder,
                encoder_attention_mask=cross_mask,
                rotary_embedding=rotary,
            )

        out = m.proj_out(hidden)[:, 1:]
        out = out + F.linear(out, m.postprocess_conv.weight[:, :, 0])
        v = out.float()
        sin, cos = phi.sin()[:, None, None], phi.cos()[:, None, None]
        return ((sin - cos) * x_vp + (cos + sin) * v).contiguous()


def build_stable_audio(
    preset: str | StableAudioPreset = "tiny",
    *,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    **overrides,
) -> StableAudioAdapter:
    """A :class:`StableAudioAdapter` over a ``StableAudioDiTModel`` with seeded random weights.

    The weights are drawn on ``device`` (fast at the published size, reproducible per device type).

    Example:
        >>> adapter = build_stable_audio("tiny", seed=0)
        >>> adapter.latent_channels, adapter.context_channels, adapter.cond_dim
        (8, 0, 32)
    """
    preset = resolve_preset(preset, STABLE_AUDIO_PRESETS, StableAudioPreset, "a StableAudioPreset")
    kwargs = {**preset.kwargs(), **overrides}
    transformer = seeded_model(StableAudioDiTModel, kwargs, seed=seed, device=device, dtype=dtype)
    return StableAudioAdapter(transformer).eval()


@torch.no_grad()
def reference_denoise(
    transformer: StableAudioDiTModel,
    noise: torch.Tensor,
    cond: torch.Tensor,
    *,
    steps: int,
    shift: float,
    guidance: float = 1.0,
    negative: torch.Tensor | None = None,
) -> torch.Tensor:
    """One request denoised by calling ``StableAudioDiTModel.forward`` the way
    ``StableAudioPipeline`` does (``(1, C, T)`` latents, the rotary table over ``T + 1``
    positions with ``head_dim // 2`` channels, CFG as one batched forward of (negative,
    conditional) rows whose negative is zero encoder states of ``cond``'s length when none is
    given, diffusers' own attention processor), on the session's flow schedule with Euler steps and
    the flow ↔ VP/v-prediction conversion of the module docstring written out through ``x0`` and
    ``ε``. Global states: the tiled mean of the row's states, zeros for the null condition.

    The latent is kept in float32 between steps. ``noise`` ``(T, C)``, ``cond`` ``(L, D)``
    unpadded. The oracle of the parity tests; a per-request loop, not a fast path.
    """
    from stream_dit.schedule import flow_schedule

    dtype = transformer.dtype
    device = noise.device
    frames = noise.shape[0]
    repeats = transformer.config.global_states_input_dim // cond.shape[-1]
    rotary = get_1d_rotary_pos_embed(
        transformer.config.attention_head_dim // 2,
        frames + 1,
        use_real=True,
        repeat_interleave_real=False,
    )
    rotary = tuple(r.to(device) for r in rotary)

    def pair(states: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if states is None:  # the pipeline's null condition
            return torch.zeros_like(cond, dtype=dtype)[None], cond.new_zeros(
                1, 1, repeats * cond.shape[-1]
            ).to(dtype)
        glob = states.float().mean(dim=0).repeat(repeats)
        return states[None].to(dtype), glob[None, None].to(dtype)

    pos = pair(cond)
    guided = guidance != 1.0
    neg = pair(negative) if guided else None

    def v_pred(x_in: torch.Tensor, tau: torch.Tensor, enc, glob) -> torch.Tensor:
        b = enc.shape[0]
        out = transformer(
            x_in.transpose(1, 2).to(dtype).expand(b, -1, -1),
            tau.to(dtype).expand(b),
            encoder_hidden_states=enc,
            global_hidden_states=glob,
            rotary_embedding=rotary,
            return_dict=False,
        )[0]
        return out.transpose(1, 2).float()

    schedule = flow_schedule(steps, float(shift))
    x = noise[None].float()
    with diffusers_processors(transformer):
        for t_now, t_next in itertools.pairwise(schedule):
            t = torch.tensor(t_now, device=device, dtype=torch.float32)
            alpha, sigma = 1.0 - t, t
            norm = torch.sqrt(alpha**2 + sigma**2)
            cos, sin = alpha / norm, sigma / norm
            x_vp = x / norm
            tau = torch.atan2(sin, cos) / (math.pi / 2)
            if not guided:
                v = v_pred(x_vp, tau[None], *pos)
            elif neg[0].shape[1] == pos[0].shape[1]:  # the pipeline's one batched forward
                enc = torch.cat([neg[0], pos[0]])
                v_neg, v_pos = v_pred(x_vp, tau[None], enc, torch.cat([neg[1], pos[1]])).chunk(2)
                v = v_neg + guidance * (v_pos - v_neg)
            else:  # a negative prompt of another length: two forwards
                v_neg, v_pos = v_pred(x_vp, tau[None], *neg), v_pred(x_vp, tau[None], *pos)
                v = v_neg + guidance * (v_pos - v_neg)
            x0 = cos * x_vp - sin * v
            eps = sin * x_vp + cos * v
            x = x + (t_next - t_now) * (eps - x0)
    return x[0]
