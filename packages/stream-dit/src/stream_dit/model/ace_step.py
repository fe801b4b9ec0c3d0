"""ACE-Step 1.5's transformer from diffusers (``AceStepTransformer1DModel``) as a session denoiser.

Needs the ``diffusers`` extra. The adapter runs the real modules of the diffusers model (timestep
embeddings, patchify convolution, condition projection, rotary tables, transformer blocks, output
norm and de-patchify) and keeps the conventions of ``diffusers.pipelines.ace_step``:

* timesteps are the flow time ``t`` in ``[0, 1]`` (1 = noise), cast to the model's dtype, with the
  mean-flow reference ``timestep_r = t`` (so the second time embedding sees ``t − r = 0``);
* the model predicts the velocity ``dx/dt`` that the pipeline's Euler scheduler integrates, the
  convention of the session;
* the transformer's input is ``cat([context_latents, x])`` with ``context_latents = cat([src_latents,
  chunk_mask])`` (128 channels at the published size); a request without ``context`` gets zeros;
* the unconditional branch of CFG is the condition encoder's learned ``null_condition_emb``
  broadcast over the sequence: a row with no conditioning tokens attends to that one embedding
  (identical keys and values, so one token gives what the broadcast sequence gives).

What batching adds: the diffusers forward takes neither a key mask for padded frames nor one for
padded encoder states (its pipeline runs one prompt length at a time). The adapter therefore drives
the model's blocks itself and hands them key-padding masks (the sliding-window band built by
diffusers' own mask helper, combined with the frame mask), so a row of a padded batch computes what
the unpadded request computes on its own. The parity tests check this against the diffusers forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .adapter import check_conditioned_rows

try:
    from diffusers.models.embeddings import get_1d_rotary_pos_embed
    from diffusers.models.transformers import ace_step_transformer as _ace
    from diffusers.models.transformers.ace_step_transformer import AceStepTransformer1DModel

    from .ace_step_attention import diffusers_processors, use_native_processor
    from .ace_step_fused import FusedAceStep
    from .diffusers_common import resolve_preset, seeded_model
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the ACE-Step adapter needs diffusers >= 0.42: pip install 'stream-dit[diffusers]'"
    ) from exc

#: Latent frames per second of ACE-Step 1.5 audio (48 kHz, VAE downsampling 1920).
ACE_STEP_FRAME_RATE = 25.0


@dataclass(frozen=True)
class AceStepPreset:
    """Keyword arguments of ``AceStepTransformer1DModel`` for one size."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    sliding_window: int
    encoder_hidden_size: int | None = None
    in_channels: int = 192
    audio_acoustic_hidden_dim: int = 64
    patch_size: int = 2

    def kwargs(self) -> dict:
        return dict(self.__dict__)


#: ``published`` is the released ACE-Step 1.5 DiT (the diffusers defaults); ``tiny`` runs the CPU
#: tests (its window of 4 patches is short enough for the band to matter at a few dozen frames).
ACE_STEP_PRESETS: dict[str, AceStepPreset] = {
    "tiny": AceStepPreset(64, 128, 2, 4, 2, 16, sliding_window=4, encoder_hidden_size=32),
    "small": AceStepPreset(512, 1536, 6, 8, 4, 64, sliding_window=128),
    "published": AceStepPreset(2048, 6144, 24, 16, 8, 128, sliding_window=128),
}


class AceStepAdapter(nn.Module):
    """A :class:`~stream_dit.model.DenoiserAdapter` around ``AceStepTransformer1DModel``.

    Args:
        transformer: the diffusers model (eval mode; any dtype and device).
        null_condition: the condition encoder's ``null_condition_emb`` (any shape holding
            ``cond_dim`` numbers), used for rows without conditioning tokens. ``None`` draws a
            seeded random one (``seed``), as for a model with random weights.
        fused: run the blocks on the package's fused kernels
            (:class:`~stream_dit.model.ace_step_fused.FusedAceStep`): ``None`` (default) on CUDA
            only, ``True`` everywhere (the Triton interpreter or the ops' PyTorch references off
            CUDA), ``False`` never (diffusers' modules, block by block). The fused path stacks
            the QKV and gate/up projection weights once and makes the modules' weights views of
            the stacks (same memory, same values).
    """

    def __init__(
        self,
        transformer: AceStepTransformer1DModel,
        null_condition: torch.Tensor | None = None,
        *,
        seed: int = 0,
        fused: bool | None = None,
    ) -> None:
        super().__init__()
        if fused not in (None, True, False):
            raise TypeError(f"fused must be None, True or False, got {fused!r}")
        self.fused = fused
        if not isinstance(transformer, AceStepTransformer1DModel):
            raise TypeError(
                f"transformer must be an AceStepTransformer1DModel, got {type(transformer).__name__}"
            )
        cfg = transformer.config
        self.transformer = transformer
        self.latent_channels = int(cfg.audio_acoustic_hidden_dim)
        self.context_channels = int(cfg.in_channels) - self.latent_channels
        self.cond_dim = int(cfg.encoder_hidden_size or cfg.hidden_size)
        self.patch = int(cfg.patch_size)
        # decided once (torch.compile cannot trace diffusers' backend lookup): set the attention
        # backend of the transformer before wrapping it
        self._flash = _ace._is_flash_attention_backend(transformer.layers[0].self_attn.processor)
        use_native_processor(transformer)
        param = next(transformer.parameters())
        if null_condition is None:
            gen = torch.Generator().manual_seed(int(seed))
            null_condition = torch.randn(self.cond_dim, generator=gen)
        if null_condition.numel() != self.cond_dim:
            raise ValueError(
                f"null_condition must hold cond_dim={self.cond_dim} numbers, "
                f"got shape {tuple(null_condition.shape)}"
            )
        self.null_condition = nn.Parameter(
            null_condition.detach().reshape(self.cond_dim).to(param.device, param.dtype),
            requires_grad=False,
        )
        self._fused_model: FusedAceStep | None = None
        self.prepare()

    #: :meth:`forward` takes ``conditioned_rows`` (engines pass it on).
    takes_conditioned_rows = True

    def _fused_enabled(self, device: torch.device) -> bool:
        if _EXPORTING[0]:
            return False
        return self.fused if self.fused is not None else device.type == "cuda"

    def prepare(self) -> FusedAceStep | None:
        """Build the fused path's prepared weights now (stacked projections), or again after the
        model moved (``.to()``); the first forward does it otherwise. Engines call it before
        compiling. ``None`` (nothing built) where the fused path is off for the model's device."""
        if not self._fused_enabled(self.null_condition.device):
            return None
        if self._fused_model is None or self._fused_model.stale():
            self._fused_model = FusedAceStep(self.transformer)
        return self._fused_model

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.dtype

    def _self_masks(
        self, key_mask: torch.Tensor | None, n: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(sliding-window layers' mask, full-attention layers' mask) over ``n`` patches."""
        m = self.transformer
        if self._flash:
            # flash backends take the window as an argument and padding as a 2-D key mask
            return key_mask, key_mask
        band = _ace._create_4d_mask(
            seq_len=n,
            dtype=dtype,
            device=device,
            attention_mask=key_mask,
            sliding_window=m.config.sliding_window,
            is_sliding_window=True,
            is_causal=False,
        )
        full = None if key_mask is None else key_mask[:, None, None, :]
        return band, full

    @staticmethod
    @contextlib.contextmanager
    def export_context() -> Iterator[None]:
        """Entered by :func:`~stream_dit.engines.tensorrt.export_onnx` around the trace: the
        rotary embedding with a split the ONNX trace keeps dynamic in T (same arithmetic)."""
        _ace.apply_rotary_emb = _rotary_for_export
        _EXPORTING[0] = True  # the exported graph is the reference forward's
        try:
            yield
        finally:
            _ace.apply_rotary_emb = _ace_apply_rotary_emb
            _EXPORTING[0] = False

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        states: torch.Tensor,
        states_mask: torch.Tensor,
        frame_mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        *,
        conditioned_rows: int | None = None,
    ) -> torch.Tensor:
        """The velocity (the :class:`~stream_dit.model.DenoiserAdapter` contract).
        ``conditioned_rows``: a promise that the rows from this index on have no conditioning
        tokens (``states_mask`` all False: CFG's unconditional rows, padded rows); the fused
        path then gives them the null condition's cross-attention without computing it per
        query. ``None``: no promise."""
        m = self.transformer
        dtype = self.dtype
        b = x.shape[0]
        check_conditioned_rows(conditioned_rows, b)
        frames = x.shape[1]
        p = self.patch
        fused = None
        if self._fused_enabled(x.device):
            # traced (torch.compile), the build of prepare() stands: engines prepare first
            fused = self._fused_model if torch.compiler.is_compiling() else self.prepare()

        # the pipeline's conventions: t in [0, 1] in the model's dtype, timestep_r = t
        t = t.to(dtype)
        temb_t, proj_t = m.time_embed(t)
        temb_r, proj_r = m.time_embed_r(t - t)
        temb = temb_t + temb_r
        timestep_proj = proj_t + proj_r

        if context is None:
            context = x.new_zeros(b, frames, self.context_channels)
        hidden = torch.cat([context.to(dtype), x.to(dtype)], dim=-1)
        # always pad (possibly by 0) so an exported graph stays correct for every T
        hidden = F.pad(hidden, (0, 0, 0, (-frames) % p))
        if fused is not None:
            hidden = fused.patchify(hidden)
        else:
            # contiguous tokens: the convolution's (B, C, T) output read as (B, T, C) would carry
            # a feature stride of T through the residual stream, and every Linear would get a
            # misaligned operand (cuBLAS falls back to an sm75 align-1 kernel: 3x slower at the
            # published size)
            hidden = m.proj_in_conv(hidden.transpose(1, 2)).transpose(1, 2).contiguous()
        n = hidden.shape[1]

        # rows without tokens (the unconditional branch) attend to the learned null embedding
        states_mask = states_mask.to(torch.bool)
        empty = ~states_mask.any(dim=1)
        states = states.to(dtype)
        first = torch.where(empty[:, None], self.null_condition.to(dtype), states[:, 0])
        states = torch.cat([first[:, None], states[:, 1:]], dim=1)
        states_mask = torch.cat([states_mask[:, :1] | empty[:, None], states_mask[:, 1:]], dim=1)
        encoder = m.condition_embedder(states)
        cross_mask = states_mask[:, None, None, :]

        key_mask = None
        if frame_mask is not None:
            # a patch is real when its first frame is
            key_mask = frame_mask.to(torch.bool)[:, ::p][:, :n]
        if fused is not None:
            hidden = fused.blocks(hidden, timestep_proj, temb, encoder, key_mask, states_mask,
                                  conditioned_rows)  # fmt: skip
            return fused.unpatchify(hidden)[:, :frames].contiguous()
        band, full = self._self_masks(key_mask, n, x.device, dtype)

        # the rotary tables of `_ace_step_rotary_freqs`, with positions derived from the tokens so
        # an ONNX trace keeps them dynamic in T (a Python int length would be baked in)
        positions = torch.ones_like(hidden[0, :, 0], dtype=torch.float32).cumsum(0) - 1.0
        cos, sin = get_1d_rotary_pos_embed(
            m.head_dim, positions, theta=m.rope_theta, use_real=True, repeat_interleave_real=False
        )
        rotary = (cos.to(dtype), sin.to(dtype))
        for layer_type, layer in zip(m.layer_types, m.layers):
            hidden = layer(
                hidden_states=hidden,
                position_embeddings=rotary,
                temb=timestep_proj,
                attention_mask=band if layer_type == "sliding_attention" else full,
                encoder_hidden_states=encoder,
                encoder_attention_mask=cross_mask,
            )

        shift, scale = (m.scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)
        hidden = (m.norm_out(hidden) * (1 + scale) + shift).type_as(hidden)
        out = m.proj_out_conv(hidden.transpose(1, 2)).transpose(1, 2)
        # the de-patchify output is channel-major: the fused guidance kernel reads contiguous rows
        return out[:, :frames].float().contiguous()


def _rotary_for_export(x, freqs_cis, use_real=True, use_real_unbind_dim=-1, sequence_dim=2):
    """diffusers' ``apply_rotary_emb`` for ACE-Step's layout (real tables, rotate-half, sequence
    on dim 1), splitting the head dimension with ``chunk``: the original's
    ``reshape(*x.shape[:-1], 2, -1)`` is traced with the example's sequence length baked in."""
    if not use_real or use_real_unbind_dim != -2 or sequence_dim != 1:
        return _ace_apply_rotary_emb(x, freqs_cis, use_real, use_real_unbind_dim, sequence_dim)
    cos, sin = (f[None, :, None, :].to(x.device) for f in freqs_cis)
    x_real, x_imag = x.chunk(2, dim=-1)
    rotated = torch.cat([-x_imag, x_real], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


_ace_apply_rotary_emb = _ace.apply_rotary_emb
#: set while an ONNX export traces the adapter: the exported graph is the reference forward's
_EXPORTING = [False]


def build_ace_step(
    preset: str | AceStepPreset = "tiny",
    *,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    fused: bool | None = None,
    **overrides,
) -> AceStepAdapter:
    """An :class:`AceStepAdapter` over an ``AceStepTransformer1DModel`` with seeded random weights.

    The weights are drawn on ``device`` (fast at the published size, reproducible per device type).
    ``fused`` as :class:`AceStepAdapter`'s (default: the fused kernels on CUDA).

    Example:
        >>> adapter = build_ace_step("tiny", seed=0)
        >>> adapter.latent_channels, adapter.context_channels, adapter.cond_dim
        (64, 128, 32)
    """
    preset = resolve_preset(preset, ACE_STEP_PRESETS, AceStepPreset, "an AceStepPreset")
    kwargs = {**preset.kwargs(), **overrides}
    transformer = seeded_model(
        AceStepTransformer1DModel, kwargs, seed=seed, device=device, dtype=dtype
    )
    return AceStepAdapter(transformer, seed=seed, fused=fused).eval()


@torch.no_grad()
def reference_denoise(
    transformer: AceStepTransformer1DModel,
    noise: torch.Tensor,
    cond: torch.Tensor,
    *,
    steps: int,
    shift: float,
    null_condition: torch.Tensor,
    guidance: float = 1.0,
    negative: torch.Tensor | None = None,
    context: torch.Tensor | None = None,
) -> torch.Tensor:
    """One request denoised the way ``AceStepPipeline`` drives the transformer: its timestep
    schedule and flow-matching Euler scheduler, ``timestep_r = t``, CFG as one batched forward of
    (conditional, negative) rows, the negative being ``null_condition`` broadcast over ``cond``'s
    length when none is given. Guidance is plain CFG ``v_neg + g·(v_pos − v_neg)`` (the session's
    fused path; the pipeline itself applies APG on top of the same two velocities).

    The latent is kept in float32 between steps (the pipeline keeps it in the model's dtype).
    ``noise`` ``(T, C)``, ``cond`` ``(L, D)`` unpadded, ``context`` ``(T, C_ctx)`` or ``None``
    (zeros). The oracle of the parity tests; a per-request loop, not a fast path.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.ace_step.pipeline_ace_step import AceStepPipeline

    dtype = transformer.dtype
    device = noise.device
    frames = noise.shape[0]
    ctx_channels = transformer.config.in_channels - transformer.config.audio_acoustic_hidden_dim
    if context is None:
        context = noise.new_zeros(frames, ctx_channels)
    sigmas = AceStepPipeline._get_timestep_schedule(
        None, num_inference_steps=steps, shift=shift, device=device, dtype=torch.float32
    )
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1, shift=1.0)
    scheduler.set_timesteps(sigmas=sigmas.tolist(), device=device)
    guided = guidance != 1.0
    states = cond[None].to(dtype)
    ctx = context[None].to(dtype)
    if guided:
        neg = (
            negative[None].to(dtype)
            if negative is not None
            else null_condition.reshape(1, 1, -1).to(dtype).expand_as(states)
        )

    def velocity(x: torch.Tensor, t: torch.Tensor, enc: torch.Tensor) -> torch.Tensor:
        b = enc.shape[0]
        return transformer(
            hidden_states=x.to(dtype).expand(b, -1, -1),
            timestep=t.expand(b),
            timestep_r=t.expand(b),
            encoder_hidden_states=enc,
            context_latents=ctx.expand(b, -1, -1),
            return_dict=False,
        )[0].float()

    x = noise[None].float()
    # the oracle runs diffusers' own attention processor, not the adapter's
    with diffusers_processors(transformer):
        for t_sched in scheduler.timesteps:
            t = float(t_sched) * torch.ones(1, device=device, dtype=dtype)
            if not guided:
                v = velocity(x, t, states)
            else:
                if neg.shape[1] == states.shape[1]:  # the pipeline's one batched forward
                    v_pos, v_neg = velocity(x, t, torch.cat([states, neg])).chunk(2)
                else:  # a negative prompt of another length: two forwards
                    v_pos, v_neg = velocity(x, t, states), velocity(x, t, neg)
                v = v_neg + guidance * (v_pos - v_neg)
            x = scheduler.step(v, t_sched, x, return_dict=False)[0]
    return x[0]
