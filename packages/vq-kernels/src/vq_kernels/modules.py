"""``VectorQuantizer`` and ``ResidualVQ``: nn.Modules over the fused ops.

Both keep stacked codebooks ``(L, K, D)`` (``L = 1`` for :class:`VectorQuantizer`) so that the EMA
update of every level runs as one fused call after the residual search.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ._state_checks import check_quantizer_state
from .ops._validation import require_integer, require_tensor
from .ops.ema_update import (
    DEFAULT_THRESHOLDS,
    SEMANTICS,
    ema_statistics,
    ema_update_,
    restart_dead_learned_,
)
from .ops.ema_update.validation import DEFAULT_FOR_SEMANTICS
from .ops.quantize import METRICS, quantize
from .ops.residual_quantize import residual_quantize

__all__ = ["ResidualVQ", "VQOutput", "VectorQuantizer", "perplexity"]


class VQOutput(NamedTuple):
    """What a quantizer's forward returns.

    Attributes:
        quantized: ``(..., D)`` straight-through output (value of the quantized vector, gradient of
            the identity to the input).
        codes: ``(...,)`` for :class:`VectorQuantizer`, ``(..., L)`` for :class:`ResidualVQ`, int64.
        loss: scalar: commitment loss × weight (+ codebook loss when the codebook is learned).
        restarted: bool ``(K,)`` / ``(L, K)`` codes restarted by this training step, or None
            (eval mode, or restarts off: ``dead_threshold=None``).
    """

    quantized: torch.Tensor
    codes: torch.Tensor
    loss: torch.Tensor
    restarted: torch.Tensor | None


def perplexity(codes: torch.Tensor, num_codes: int) -> torch.Tensor:
    """``exp(entropy)`` of the code histogram: K when codes are used uniformly, 1 when one code
    takes everything. ``codes`` of any integer dtype and shape; codes outside ``[0, num_codes)``
    take no part (as in the EMA statistics); no code at all gives 1. Returns a 0-d fp32 tensor."""
    require_tensor("codes", codes)
    require_integer("codes", codes)
    if isinstance(num_codes, bool) or not isinstance(num_codes, int) or num_codes < 1:
        raise ValueError(f"num_codes must be an int >= 1, got {num_codes!r}")
    flat = codes.reshape(-1).long()
    inside = (flat >= 0) & (flat < num_codes)
    # out-of-range codes go to an extra bin that is dropped: no host synchronisation
    flat = torch.where(inside, flat, torch.full_like(flat, num_codes))
    counts = torch.bincount(flat, minlength=num_codes + 1)[:num_codes].float()
    p = counts / counts.sum().clamp_min(1)
    return torch.exp(-(p * torch.log(p.clamp_min(1e-12))).sum())


def _mean_square(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``mse_loss`` that is 0, not NaN, on an empty batch (a DDP rank may get none)."""
    return (a - b).float().square().sum() / max(a.numel(), 1)


class ResidualVQ(nn.Module):
    """Residual vector quantizer: ``L`` codebooks, level ``l`` quantizes the residual
    ``r_l = r_{l-1} − q_l`` (``r_0 = x``); the output is ``Σ q_l`` with a straight-through gradient.

    Args:
        dim: vector size ``D``.
        codebook_size: codes per level ``K``.
        num_levels: ``L``.
        ema: keep the codebooks as EMA buffers updated by :func:`vq_kernels.ema_update_` in
            training mode (default); False makes them a learned ``nn.Parameter`` trained by the
            codebook loss ``‖q − sg(r)‖²``.
        decay, eps, semantics, dead_threshold, deterministic: passed to ``ema_update_``. A
            learned codebook (``ema=False``) restarts its dead codes too: it keeps the same usage
            statistics (``decay``, ``semantics``, ``dead_threshold``) and a dead code takes a
            random row of the step's residuals (see
            :func:`vq_kernels.ops.ema_update.restart_dead_learned_`).
        commitment_weight: weight of ``‖r − sg(q)‖²`` (per level, summed over levels).
        metric: ``"l2"`` or ``"cosine"`` nearest-code search.
        kmeans_init: initialise each level's codebook by k-means (``kmeans_iters`` Lloyd steps, on the
            device) on the first training batch's residuals.
        process_group: a ``torch.distributed`` group: EMA statistics (and k-means statistics) are
            all-reduced over it and restart rows come from group rank 0, so ranks stay identical.
        backend: kernel backend for every op (``None``: automatic).
        generator: a ``torch.Generator`` on the codebooks' device for the restart draws (and the
            k-means++ seeds). To capture a training step as a CUDA graph, list it in
            :class:`triton_dispatch.graphs.CapturedStep`'s ``generators``.
        fused: search every level in one :func:`vq_kernels.residual_quantize` call (default);
            False runs one :func:`vq_kernels.quantize` call per level (the step that initialises
            the codebooks by k-means always does).

    The forward never synchronises with the host and, once the codebooks are initialised, takes
    no branch on tensor values, so a whole training step can be captured as a CUDA graph.
    """

    def __init__(
        self,
        dim: int,
        codebook_size: int,
        num_levels: int = 1,
        *,
        ema: bool = True,
        decay: float = 0.99,
        eps: float = 1e-5,
        commitment_weight: float = 0.25,
        semantics: str = "active_only",
        dead_threshold: float | None = DEFAULT_FOR_SEMANTICS,  # type: ignore[assignment]
        metric: str = "l2",
        kmeans_init: bool = False,
        kmeans_iters: int = 10,
        deterministic: bool = False,
        process_group=None,
        backend: str | None = None,
        generator: torch.Generator | None = None,
        fused: bool = True,
    ) -> None:
        super().__init__()
        if dim < 1 or codebook_size < 1 or num_levels < 1:
            raise ValueError(
                f"dim, codebook_size and num_levels must be >= 1, got {dim}, {codebook_size}, "
                f"{num_levels}"
            )
        if semantics not in SEMANTICS:
            raise ValueError(f"semantics must be one of {SEMANTICS}, got {semantics!r}")
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
        if (
            dead_threshold is not DEFAULT_FOR_SEMANTICS
            and dead_threshold is not None
            and not dead_threshold > 0
        ):
            raise ValueError(f"dead_threshold must be > 0 or None, got {dead_threshold}")
        self.dim, self.codebook_size, self.num_levels = dim, codebook_size, num_levels
        self.ema, self.decay, self.eps = ema, decay, eps
        self.commitment_weight = commitment_weight
        self.semantics = semantics
        self.dead_threshold = (
            DEFAULT_THRESHOLDS[semantics]
            if dead_threshold is DEFAULT_FOR_SEMANTICS
            else dead_threshold
        )
        self.metric, self.kmeans_init, self.kmeans_iters = metric, kmeans_init, kmeans_iters
        self.deterministic, self.process_group, self.backend = deterministic, process_group, backend
        self.generator = generator
        self.fused = fused
        self._updates_ahead: set[int] = set()  # batch sizes whose update compiles were started

        init = torch.randn(num_levels, codebook_size, dim)
        if ema:
            self.register_buffer("codebook", init)
        else:
            self.codebook = nn.Parameter(init)
        # A fresh code behaves as if it had seen one sample equal to its row.
        self.register_buffer("cluster_size", torch.ones(num_levels, codebook_size))
        self.register_buffer("embed_sum", init.clone())
        self.register_buffer(
            "steps_since_active", torch.zeros(num_levels, codebook_size, dtype=torch.int32)
        )
        self.register_buffer("initialized", torch.tensor(not kmeans_init))
        self._initialized = not kmeans_init

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # torch would cast a wrong dtype silently; refuse wrong shapes and dtypes by name first
        check_quantizer_state(
            state_dict,
            prefix,
            levels=self.num_levels,
            codes=self.codebook_size,
            dim=self.dim,
            owner=type(self).__name__,
        )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._initialized = bool(self.initialized)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, codebook_size={self.codebook_size}, num_levels={self.num_levels}, "
            f"ema={self.ema}, semantics={self.semantics!r}, metric={self.metric!r}"
        )

    @torch.no_grad()
    def _kmeans_level(self, data: torch.Tensor, level: int) -> None:
        num_codes = self.codebook_size
        centroids = self._kmeans_pp_seeds(data.float(), num_codes)
        if self.process_group is not None:
            import torch.distributed as dist

            dist.broadcast(
                centroids, src=dist.get_global_rank(self.process_group, 0), group=self.process_group
            )
        counts = torch.zeros(num_codes, device=data.device)
        for _ in range(max(self.kmeans_iters, 1)):
            codes, _ = quantize(data, centroids, metric=self.metric, backend=self.backend)
            counts, sums = ema_statistics(data, codes, num_codes, backend=self.backend)
            if self.process_group is not None:
                import torch.distributed as dist

                both = torch.cat([counts[:, None], sums], 1)  # one collective, not two
                dist.all_reduce(both, group=self.process_group)
                counts, sums = both[:, 0], both[:, 1:]
            means = sums / counts.clamp_min(1)[:, None]
            centroids = torch.where(counts[:, None] > 0, means, centroids)
        self.codebook.data[level].copy_(centroids)
        self.cluster_size[level].copy_(counts)
        self.embed_sum[level].copy_(centroids * counts[:, None])
        self.steps_since_active[level].zero_()

    def _kmeans_pp_seeds(self, data: torch.Tensor, num_codes: int) -> torch.Tensor:
        """k-means++ seeding on the device: each next seed is drawn with probability ∝ its squared
        distance to the nearest seed so far (no host sync; one small step per code)."""
        n = data.shape[0]
        first = torch.randint(0, n, (1,), device=data.device, generator=self.generator)
        seeds = data.new_empty(num_codes, data.shape[1])
        seeds[0] = data[first[0]]
        nearest = ((data - seeds[0]) ** 2).sum(-1)
        for i in range(1, num_codes):
            weights = nearest.clamp_min(0) + 1e-12  # all-zero (duplicate data) → uniform
            pick = torch.multinomial(weights, 1, generator=self.generator)
            seeds[i] = data[pick[0]]
            nearest = torch.minimum(nearest, ((data - seeds[i]) ** 2).sum(-1))
        return seeds

    def _search(self, residual: torch.Tensor, level: int):
        return quantize(residual, self.codebook[level], metric=self.metric, backend=self.backend)

    def _levels(self, flat: torch.Tensor, init_now: bool):
        """The per-level path: one :func:`quantize` call per level, the losses written out (and
        k-means initialisation of each level on the residual it sees)."""
        residual = flat
        quantized = torch.zeros_like(flat)
        loss = flat.new_zeros((), dtype=torch.float32)
        codes, inputs = [], []
        for level in range(self.num_levels):
            if init_now:
                self._kmeans_level(residual.detach(), level)
            c, q = self._search(residual.detach(), level)
            codes.append(c)
            inputs.append(residual.detach())
            q = q.to(flat.dtype)
            loss = loss + self.commitment_weight * _mean_square(residual, q.detach())
            if not self.ema:
                loss = loss + _mean_square(q, residual.detach())
            residual = residual - q.detach()
            quantized = quantized + q
        if init_now:
            self.initialized.fill_(True)
            self._initialized = True
        codes_t = torch.stack(codes, -1)
        # Straight-through: the value of the quantized vector, the gradient of the identity to x.
        # A learned codebook gets its gradient from the codebook loss only.
        out = flat + (quantized - flat).detach()
        return out, codes_t, loss, torch.stack(inputs), codes_t.T

    def _compile_update_ahead(self, flat: torch.Tensor) -> None:
        # the first training step of a batch size compiles the search, then the update: start the
        # update's compile now so the two overlap (a guess; a wrong one only costs the thread)
        batch = flat.shape[0]
        if (
            torch.compiler.is_compiling()
            or not (self.training and self.ema and flat.is_cuda)
            or batch in self._updates_ahead
            or self.process_group is not None
            or self.semantics != "active_only"
            or self.deterministic
        ):
            return
        from .ops.ema_update.kernels import compile_update_ahead

        self._updates_ahead.add(batch)
        threshold = None if self.dead_threshold is None else float(self.dead_threshold)
        compile_update_ahead(
            flat.dtype, batch, self.codebook, self.cluster_size, self.embed_sum,
            self.steps_since_active, self.decay, self.eps, threshold,
        )  # fmt: skip

    def _fused(self, flat: torch.Tensor):
        """The fused path: every level, the straight-through output and both losses from
        :func:`residual_quantize`, inputs and codes already stacked for the EMA update."""
        self._compile_update_ahead(flat)
        res = residual_quantize(
            flat,
            self.codebook,
            metric=self.metric,
            commitment_weight=self.commitment_weight,
            codebook_weight=0.0 if self.ema else 1.0,
            backend=self.backend,
        )
        loss = res.loss if res.loss.dtype == torch.float32 else res.loss.float()
        return res.quantized, res.codes, loss, res.inputs, res.level_codes

    def forward(self, x: torch.Tensor) -> VQOutput:
        if x.dim() < 1 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (..., {self.dim}), got {tuple(x.shape)}")
        lead = x.shape[:-1]
        flat = x.reshape(-1, self.dim)
        init_now = self.training and not self._initialized and flat.shape[0] > 0
        if self.fused and not init_now:
            out, codes_t, loss, inputs, level_codes = self._fused(flat)
        else:
            out, codes_t, loss, inputs, level_codes = self._levels(flat, init_now)
        restarted = None
        if self.training and not self.ema and self.dead_threshold is not None:
            restarted = restart_dead_learned_(
                self.codebook.data,
                self.cluster_size,
                self.steps_since_active,
                inputs,
                level_codes,
                decay=self.decay,
                semantics=self.semantics,
                threshold=float(self.dead_threshold),
                generator=self.generator,
                process_group=self.process_group,
            )
        if self.training and self.ema:
            restarted = ema_update_(
                inputs,
                level_codes,
                self.codebook,
                self.cluster_size,
                self.embed_sum,
                self.steps_since_active,
                decay=self.decay,
                eps=self.eps,
                semantics=self.semantics,
                dead_threshold=self.dead_threshold,
                generator=self.generator,
                deterministic=self.deterministic,
                process_group=self.process_group,
                check_codes=False,
                backend=self.backend,
            )
        return VQOutput(
            out.view(*lead, self.dim), codes_t.view(*lead, self.num_levels), loss, restarted
        )


class VectorQuantizer(ResidualVQ):
    """A single-codebook vector quantizer: :class:`ResidualVQ` with one level, returning codes
    ``(...,)`` and ``restarted (K,)``. Same arguments, less ``num_levels``."""

    def __init__(self, dim: int, codebook_size: int, **kwargs) -> None:
        if "num_levels" in kwargs:
            raise TypeError("VectorQuantizer has one level; use ResidualVQ for num_levels")
        super().__init__(dim, codebook_size, 1, **kwargs)

    def forward(self, x: torch.Tensor) -> VQOutput:
        out = super().forward(x)
        restarted = out.restarted[0] if out.restarted is not None else None
        return VQOutput(out.quantized, out.codes[..., 0], out.loss, restarted)
