"""The built-in denoiser: a diffusion transformer over 1-D latent sequences.

Latents are ``(B, T, C)`` frames (25 frames per second of audio, 64 channels by default). Frames are
grouped into patches along time, embedded, and run through AdaLN-zero blocks (self-attention,
cross-attention to the conditioning, MLP) modulated by the timestep embedding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

#: Latent frames per second of audio (the rate of the music latent models this mimics).
FRAME_RATE = 25.0
LATENT_CHANNELS = 64


@dataclass(frozen=True)
class DiTConfig:
    """Shape of a :class:`DiT1D`."""

    hidden: int
    depth: int
    heads: int
    cond_dim: int
    patch: int = 1
    mlp_ratio: float = 4.0
    latent_channels: int = LATENT_CHANNELS
    context_channels: int = 0

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} must be a multiple of heads={self.heads}")
        for name in ("hidden", "depth", "heads", "cond_dim", "patch", "latent_channels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


#: Size presets. "tiny" runs the CPU tests; "large" keeps an H100 busy with GEMM and attention.
PRESETS: dict[str, DiTConfig] = {
    "tiny": DiTConfig(hidden=64, depth=2, heads=4, cond_dim=32),
    "small": DiTConfig(hidden=384, depth=6, heads=6, cond_dim=256),
    "base": DiTConfig(hidden=768, depth=12, heads=12, cond_dim=512),
    "large": DiTConfig(hidden=1024, depth=24, heads=16, cond_dim=1024),
}


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10_000.0) -> torch.Tensor:
    """Sinusoidal features of ``1000·t`` ``(B,) -> (B, dim)``."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half
    )
    args = (t.float() * 1000.0)[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def position_embedding(n: int, dim: int, device: torch.device) -> torch.Tensor:
    """Fixed sinusoidal positions ``(n, dim)`` of the patch sequence."""
    pos = torch.arange(n, device=device, dtype=torch.float32)
    half = dim // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, device=device) / half)
    args = pos[:, None] * freqs[None]
    return torch.cat([torch.sin(args), torch.cos(args)], dim=-1)


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


class DiTBlock(nn.Module):
    """AdaLN-zero block: modulated self-attention, cross-attention, modulated MLP."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        h = cfg.hidden
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(h, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(h, 3 * h)
        self.attn_out = nn.Linear(h, h)
        self.norm2 = nn.LayerNorm(h, eps=1e-6)
        self.cross_q = nn.Linear(h, h)
        self.cross_kv = nn.Linear(cfg.cond_dim, 2 * h)
        self.cross_out = nn.Linear(h, h)
        self.norm3 = nn.LayerNorm(h, elementwise_affine=False, eps=1e-6)
        inner = int(h * cfg.mlp_ratio)
        self.mlp_in = nn.Linear(h, inner)
        self.mlp_out = nn.Linear(inner, h)
        self.modulation = nn.Linear(h, 6 * h)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.heads, -1).transpose(1, 2)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        b, _, n, _ = x.shape
        return x.transpose(1, 2).reshape(b, n, -1)

    def forward(
        self,
        x: torch.Tensor,
        c: torch.Tensor,
        self_mask: torch.Tensor | None,
        states: torch.Tensor,
        cross_mask: torch.Tensor,
    ) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(c).chunk(6, dim=-1)
        q, k, v = self.qkv(_modulate(self.norm1(x), shift1, scale1)).chunk(3, dim=-1)
        attn = F.scaled_dot_product_attention(
            self._heads(q), self._heads(k), self._heads(v), attn_mask=self_mask
        )
        x = x + gate1[:, None] * self.attn_out(self._merge(attn))
        ck, cv = self.cross_kv(states).chunk(2, dim=-1)
        cross = F.scaled_dot_product_attention(
            self._heads(self.cross_q(self.norm2(x))),
            self._heads(ck),
            self._heads(cv),
            attn_mask=cross_mask,
        )
        x = x + self.cross_out(self._merge(cross))
        hid = F.gelu(self.mlp_in(_modulate(self.norm3(x), shift2, scale2)), approximate="tanh")
        return x + gate2[:, None] * self.mlp_out(hid)


class DiT1D(nn.Module):
    """Diffusion transformer over ``(B, T, C)`` latents that predicts the flow velocity.

    Implements :class:`~stream_dit.model.adapter.DenoiserAdapter`. Cross-attention always sees one
    learned "null" token besides the conditioning, so a row whose conditioning is entirely masked
    (the unconditional branch of CFG) attends to it instead of producing NaN.
    """

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.latent_channels = cfg.latent_channels
        self.cond_dim = cfg.cond_dim
        self.context_channels = cfg.context_channels
        h, p = cfg.hidden, cfg.patch
        self.patch_in = nn.Linear(p * (cfg.latent_channels + cfg.context_channels), h)
        self.time_in = nn.Linear(256, h)
        self.time_out = nn.Linear(h, h)
        self.null_token = nn.Parameter(torch.zeros(1, 1, cfg.cond_dim))
        self.blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.depth))
        self.norm_out = nn.LayerNorm(h, elementwise_affine=False, eps=1e-6)
        self.modulation_out = nn.Linear(h, 2 * h)
        self.patch_out = nn.Linear(h, p * cfg.latent_channels)

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_in.weight.dtype

    def reset_parameters(self, seed: int, *, zero_init: bool = False) -> DiT1D:
        """Deterministic weights from ``seed`` (drawn on the host, so identical on every device).

        ``zero_init=True`` gives the AdaLN-zero initialisation used for training (every block and
        the output start as the identity / zero). The default keeps the modulation small but
        non-zero so an untrained model still maps inputs to varied, non-trivial velocities.
        """
        gen = torch.Generator().manual_seed(int(seed))
        with torch.no_grad():
            for name, param in self.named_parameters():
                fan_in = param.shape[-1] if param.dim() > 1 else 1
                if name.endswith("bias"):
                    values = torch.zeros(param.shape)
                elif "modulation" in name or name.startswith("patch_out"):
                    std = 0.0 if zero_init else 0.5 / math.sqrt(fan_in)
                    values = torch.randn(param.shape, generator=gen) * std
                else:
                    values = torch.randn(param.shape, generator=gen) / math.sqrt(fan_in)
                param.copy_(values.to(param.dtype))
        return self

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        states: torch.Tensor,
        states_mask: torch.Tensor,
        frame_mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, frames, channels = x.shape
        p = self.cfg.patch
        dtype = self.dtype
        if self.context_channels:
            if context is None:
                context = x.new_zeros(b, frames, self.context_channels)
            x_in = torch.cat([x, context.to(x.dtype)], dim=-1)
        else:
            x_in = x
        pad = (-frames) % p if p > 1 else 0
        if p > 1 and pad:  # skipped for patch 1, so ONNX traces of those models stay shape-generic
            x_in = F.pad(x_in, (0, 0, 0, pad))
        n = (frames + pad) // p
        tokens = self.patch_in(x_in.reshape(b, n, -1).to(dtype))
        tokens = tokens + position_embedding(n, tokens.shape[-1], x.device).to(dtype)
        c = self.time_out(F.silu(self.time_in(timestep_embedding(t, 256).to(dtype))))
        c = F.silu(c)

        self_mask = None
        if frame_mask is not None:
            # a patch is real when its first frame is; padded keys are hidden from every query
            self_mask = frame_mask[:, ::p][:, None, None, :n]
        null = self.null_token.to(dtype).expand(b, 1, -1)
        states = torch.cat([null, states.to(dtype)], dim=1)
        ones = torch.ones(b, 1, dtype=torch.bool, device=x.device)
        cross_mask = torch.cat([ones, states_mask.to(torch.bool)], dim=1)[:, None, None, :]

        for block in self.blocks:
            tokens = block(tokens, c, self_mask, states, cross_mask)
        shift, scale = self.modulation_out(c).chunk(2, dim=-1)
        out = self.patch_out(_modulate(self.norm_out(tokens), shift, scale))
        return out.reshape(b, n * p, channels)[:, :frames].float()


def build_model(
    preset: str | DiTConfig = "tiny",
    *,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    **overrides: int | float,
) -> DiT1D:
    """A :class:`DiT1D` of a preset (or config) with seeded weights, in eval mode.

    Example:
        >>> model = build_model("tiny", seed=0)
        >>> model.latent_channels
        64
    """
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"preset={preset!r} is not one of {sorted(PRESETS)}")
        cfg = PRESETS[preset]
    elif isinstance(preset, DiTConfig):
        cfg = preset
    else:
        raise TypeError(f"preset must be a preset name or a DiTConfig, got {type(preset).__name__}")
    if overrides:
        cfg = replace(cfg, **overrides)
    model = DiT1D(cfg).reset_parameters(seed)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
