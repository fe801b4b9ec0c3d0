"""Dead-code restarts for a codebook the optimizer learns (``ResidualVQ(ema=False)``).

The codebook rows are the optimizer's; only the usage statistics of the EMA update are kept (the
counts' EMA ``cluster_size`` and the ``steps_since_active`` counter, with the same semantics and
thresholds), and a dead code takes a random row of the step's residuals, as in
:func:`~vq_kernels.ema_update_`. Without it a learned codebook whose codes stop winning samples
never gets them back (a residual VQ trained this way collapsed to one code per level). Plain
PyTorch on ``(L, K)`` state and one gather: no host synchronisation, so a captured step can hold it.
"""

from __future__ import annotations

import torch

from .reference import gather_replacement_rows, reset_cluster_size, valid_rows


@torch.no_grad()
def restart_dead_learned_(
    codebook: torch.Tensor,
    cluster_size: torch.Tensor,
    steps_since_active: torch.Tensor,
    inputs: torch.Tensor,
    codes: torch.Tensor,
    *,
    decay: float,
    semantics: str,
    threshold: float,
    generator: torch.Generator | None = None,
    process_group=None,
) -> torch.Tensor:
    """Update the usage statistics of ``codes (L, B)`` (the codes of ``inputs (L, B, D)``) and
    restart the dead codes of ``codebook (L, K, D)`` in place; returns the ``(L, K)`` bool mask of
    restarted codes.

    ``active_only``: a code is dead when its counter of steps without an assignment reaches
    ``threshold``; ``decay_all``: when the EMA of its counts falls below ``threshold``. Under a
    ``process_group`` the counts are summed over the ranks and the restart rows come from group
    rank 0, so the replicas stay identical.
    """
    levels, num_codes = cluster_size.shape
    keep = valid_rows(inputs, codes, num_codes)
    counts = torch.zeros(levels, num_codes, dtype=cluster_size.dtype, device=codebook.device)
    counts.scatter_add_(1, torch.where(keep, codes.long(), 0), keep.to(counts.dtype))
    if process_group is not None:
        import torch.distributed as dist

        dist.all_reduce(counts, group=process_group)
    active = counts > 0
    blended = decay * cluster_size + (1.0 - decay) * counts
    size = blended if semantics == "decay_all" else torch.where(active, blended, cluster_size)
    counter = torch.where(active, torch.zeros_like(steps_since_active), steps_since_active + 1)
    dead = counter >= threshold if semantics == "active_only" else size < threshold
    pick = torch.randint(
        0, max(inputs.shape[1], 1), (levels, num_codes), device=inputs.device, generator=generator
    )
    rows = gather_replacement_rows(inputs, pick).to(codebook.dtype)
    if process_group is not None:
        import torch.distributed as dist

        dist.broadcast(rows, src=dist.get_global_rank(process_group, 0), group=process_group)
    replaced = dead & torch.isfinite(rows).all(-1)  # an empty batch has no rows to give
    codebook.copy_(torch.where(replaced[..., None], rows, codebook))
    reset = reset_cluster_size(semantics, threshold)
    cluster_size.copy_(torch.where(replaced, torch.full_like(size, reset), size))
    steps_since_active.copy_(torch.where(replaced, torch.zeros_like(counter), counter))
    return replaced
