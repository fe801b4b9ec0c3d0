"""Plain-PyTorch specification of the EMA codebook update: the CPU path and the test oracle.

Every function works on *stacked levels*: ``x (L, B, D)``, ``codes (L, B)``, codebooks
``(L, K, D)``, state ``(L, K)`` / ``(L, K, D)``. One level is ``L = 1``. Arithmetic runs in the
state's dtype (fp32 in use, float64 in the tests); ``x`` is cast to it.

The update is split in two halves so that a distributed caller can all-reduce the batch
statistics between them:

1. :func:`ema_statistics_reference` — per-code assignment counts and sums of ``x``.
2. :func:`ema_apply_reference_` — the EMA blend, codebook refresh, dead-code counter and
   restarts, in place.

Rows of ``x`` that hold a NaN or an infinity, and codes outside ``[0, K)``, take no part in the
statistics, so one bad sample cannot corrupt the codebook. A replacement row that is not finite is
not used: its code stays dead and is retried at the next step.
"""

from __future__ import annotations

import torch

SEMANTICS = ("active_only", "decay_all")


def valid_rows(x: torch.Tensor, codes: torch.Tensor, num_codes: int) -> torch.Tensor:
    """``(L, B)`` bool: rows that count (finite values and a code in ``[0, num_codes)``)."""
    return torch.isfinite(x).all(-1) & (codes >= 0) & (codes < num_codes)


def ema_statistics_reference(
    x: torch.Tensor, codes: torch.Tensor, num_codes: int, *, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts ``(L, K)`` and sums ``(L, K, D)`` of the rows of ``x`` assigned to each code.

    Uses ``index_add_`` on level-offset codes, never a ``(B, K)`` one-hot.
    """
    levels, _batch, dim = x.shape
    keep = valid_rows(x, codes, num_codes)
    flat_codes = codes.long() + torch.arange(levels, device=x.device)[:, None] * num_codes
    flat_codes = torch.where(keep, flat_codes, torch.zeros_like(flat_codes)).reshape(-1)
    weights = keep.reshape(-1).to(dtype)
    rows = torch.where(keep[..., None], x.to(dtype), torch.zeros((), dtype=dtype, device=x.device))
    counts = torch.zeros(levels * num_codes, dtype=dtype, device=x.device)
    sums = torch.zeros(levels * num_codes, dim, dtype=dtype, device=x.device)
    counts.index_add_(0, flat_codes, weights)
    sums.index_add_(0, flat_codes, rows.reshape(-1, dim))
    return counts.view(levels, num_codes), sums.view(levels, num_codes, dim)


def reset_cluster_size(semantics: str, threshold: float | None) -> float:
    """The EMA cluster size a restarted code starts from: 1 (one sample) for ``active_only``;
    the expiry threshold for ``decay_all`` (so a restarted code is not expired again before it can
    win a sample)."""
    if semantics == "decay_all" and threshold is not None:
        return float(threshold)
    return 1.0


def ema_apply_reference_(
    codebook: torch.Tensor,
    cluster_size: torch.Tensor,
    embed_sum: torch.Tensor,
    steps_since_active: torch.Tensor,
    counts: torch.Tensor,
    sums: torch.Tensor,
    replacement_rows: torch.Tensor,
    *,
    decay: float,
    eps: float,
    semantics: str,
    threshold: float | None,
) -> torch.Tensor:
    """Apply one step's statistics to the EMA state in place; return the ``(L, K)`` bool mask of
    restarted codes.

    ``active_only``: codes with a count this step blend ``cluster_size``/``embed_sum`` with decay and
    refresh their codebook row to ``embed_sum / max(cluster_size, eps)``; the others keep all of
    their state. A code is dead when its counter of steps without an assignment reaches
    ``threshold``.

    ``decay_all``: every code decays (counts of zero included), and the codebook becomes
    ``embed_sum / smoothed`` with Laplace smoothing
    ``smoothed = (cluster_size + eps) / (n + K·eps) · n``, ``n = Σ cluster_size`` (left unchanged while
    ``n == 0``). A code is dead when its EMA ``cluster_size`` falls below ``threshold``.

    Counters count steps without an assignment in both semantics (reset to 0 by an assignment or a
    restart). A dead code whose ``replacement_rows`` row is finite takes that row as its codebook
    row, ``cluster_size = r`` and ``embed_sum = r · row`` (``r`` from :func:`reset_cluster_size`).
    ``threshold=None`` disables restarts.
    """
    dtype = cluster_size.dtype
    num_codes = cluster_size.shape[-1]
    active = counts > 0
    blended_size = decay * cluster_size + (1.0 - decay) * counts.to(dtype)
    blended_sum = decay * embed_sum + (1.0 - decay) * sums.to(dtype)
    if semantics == "active_only":
        new_size = torch.where(active, blended_size, cluster_size)
        new_sum = torch.where(active[..., None], blended_sum, embed_sum)
        refresh = active
        denom = new_size.clamp_min(eps)
    elif semantics == "decay_all":
        new_size, new_sum = blended_size, blended_sum
        total = new_size.sum(-1, keepdim=True)
        refresh = (total > 0).expand_as(new_size)
        denom = (new_size + eps) / (total + num_codes * eps) * total
    else:
        raise ValueError(f"semantics must be one of {SEMANTICS}, got {semantics!r}")
    refreshed = new_sum / torch.where(refresh, denom, torch.ones_like(denom))[..., None]
    new_codebook = torch.where(refresh[..., None], refreshed, codebook.to(dtype))

    counter = torch.where(active, torch.zeros_like(steps_since_active), steps_since_active + 1)
    if threshold is None:
        replaced = torch.zeros_like(active)
    else:
        dead = counter >= threshold if semantics == "active_only" else new_size < threshold
        replaced = dead & torch.isfinite(replacement_rows).all(-1)
    reset = reset_cluster_size(semantics, threshold)
    rows = replacement_rows.to(dtype)
    new_codebook = torch.where(replaced[..., None], rows, new_codebook)
    new_sum = torch.where(replaced[..., None], rows * reset, new_sum)
    new_size = torch.where(replaced, torch.full_like(new_size, reset), new_size)
    counter = torch.where(replaced, torch.zeros_like(counter), counter)

    codebook.copy_(new_codebook)
    cluster_size.copy_(new_size)
    embed_sum.copy_(new_sum)
    steps_since_active.copy_(counter)
    return replaced


def gather_replacement_rows(x: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """``(L, K, D)``: row ``candidates[l, k]`` of ``x[l]`` for every code (NaN rows when ``B = 0``)."""
    levels, batch, dim = x.shape
    if batch == 0:
        return x.new_full((levels, candidates.shape[-1], dim), float("nan"))
    index = candidates.long().clamp(0, batch - 1)[..., None].expand(-1, -1, dim)
    return torch.gather(x, 1, index)


def ema_update_reference_(
    x: torch.Tensor,
    codes: torch.Tensor,
    codebook: torch.Tensor,
    cluster_size: torch.Tensor,
    embed_sum: torch.Tensor,
    steps_since_active: torch.Tensor,
    candidates: torch.Tensor,
    *,
    decay: float,
    eps: float,
    semantics: str,
    threshold: float | None,
) -> torch.Tensor:
    """The whole update on stacked levels: statistics, then :func:`ema_apply_reference_` with the
    replacement row of code ``k`` of level ``l`` taken as ``x[l, candidates[l, k]]``."""
    counts, sums = ema_statistics_reference(
        x, codes, cluster_size.shape[-1], dtype=cluster_size.dtype
    )
    rows = gather_replacement_rows(x, candidates)
    return ema_apply_reference_(
        codebook,
        cluster_size,
        embed_sum,
        steps_since_active,
        counts,
        sums,
        rows,
        decay=decay,
        eps=eps,
        semantics=semantics,
        threshold=threshold,
    )
