"""``ema_statistics`` and ``ema_update_``: the public functions over the declared ops
(``op.py``)."""

from __future__ import annotations

import torch

from .op import EMA_STATISTICS, EMA_UPDATE
from .validation import DEFAULT_FOR_SEMANTICS, DEFAULT_THRESHOLDS


def ema_statistics(
    x: torch.Tensor,
    codes: torch.Tensor,
    num_codes: int,
    *,
    deterministic: bool = False,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-code counts ``(K,)`` and fp32 sums ``(K, D)`` of the rows of ``x (B, D)`` assigned by
    ``codes (B,)`` (or ``(L, K)``/``(L, K, D)`` for stacked ``x (L, B, D)``, ``codes (L, B)``),
    without a ``(B, K)`` one-hot. Non-finite rows and codes outside ``[0, K)`` are ignored."""
    x = x.detach() if isinstance(x, torch.Tensor) else x
    return EMA_STATISTICS(
        x, codes, num_codes=int(num_codes), deterministic=bool(deterministic), backend=backend
    )


def ema_update_(
    x: torch.Tensor,
    codes: torch.Tensor,
    codebook: torch.Tensor,
    cluster_size: torch.Tensor,
    embed_sum: torch.Tensor,
    steps_since_active: torch.Tensor | None = None,
    *,
    decay: float = 0.99,
    eps: float = 1e-5,
    semantics: str = "active_only",
    dead_threshold: float | None = DEFAULT_FOR_SEMANTICS,  # type: ignore[assignment]
    candidates: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    deterministic: bool = False,
    process_group=None,
    check_codes: bool | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """One EMA codebook step, in place, for one codebook or a stack of ``L`` codebooks.

    Shapes (one level / stacked levels): ``x (B, D) / (L, B, D)`` (fp32, fp16 or bf16; fp64 runs
    the reference), ``codes (B,) / (L, B)`` int32/int64, ``codebook (K, D) / (L, K, D)``,
    ``cluster_size (K,) / (L, K)`` and ``embed_sum (K, D) / (L, K, D)`` fp32 (or fp64),
    ``steps_since_active (K,) / (L, K)`` int32/int64. State tensors must be contiguous.

    The step (see ``reference.ema_apply_reference_`` for the exact math):

    1. counts and sums of ``x`` per code, by a batch-parallel scatter (no ``(B, K)`` one-hot);
       rows holding NaN/inf and codes outside ``[0, K)`` are ignored, so they cannot corrupt the
       codebook;
    2. with ``process_group``, the counts, sums and group rank 0's replacement rows of every
       level travel in one buffer through one all-reduce (sum; the other ranks add zero rows),
       so every rank ends with the same codebook;
    3. EMA blend and codebook refresh (``semantics="active_only"``: only codes assigned this step
       move, refreshed to ``embed_sum / max(cluster_size, eps)``; ``"decay_all"``: every code
       decays, refreshed with Laplace smoothing);
    4. the counter ``steps_since_active`` is reset for assigned codes and incremented for the
       others; dead codes (``active_only``: counter ≥ ``dead_threshold``; ``decay_all``: EMA
       cluster size < ``dead_threshold``) are restarted from rows of ``x``.

    Args:
        decay: EMA decay in [0, 1] (1 keeps the state, 0 replaces it by this batch).
        eps: floor of the cluster size (active-only) / Laplace constant (decay-all), > 0.
        semantics: ``"active_only"`` or ``"decay_all"``.
        dead_threshold: restart threshold; default 20 steps (active-only) or 2.0 (decay-all).
            ``None`` disables restarts; ≤ 0 is a ValueError.
        candidates: ``(K,) / (L, K)`` row indices into the batch: code ``k`` restarts from
            ``x[candidates[k]]`` if it is dead (indices are clamped into ``[0, B)``). Default: drawn
            on ``x``'s device with ``torch.randint(0, B, (L, K), generator=generator)`` — one draw
            for every code whether dead or not, so the op needs no host sync and every backend
            takes the same draws from the same generator state.
        generator: a ``torch.Generator`` on ``x``'s device for the default candidates.
        deterministic: no atomics: rows are sorted by code and each code reduces its rows in a fixed
            order, so results are bitwise reproducible run to run (Triton backends; the CPU
            reference is deterministic anyway).
        process_group: a ``torch.distributed`` group to all-reduce the statistics over. Every rank
            must call the op; a rank with ``B = 0`` contributes no statistics.
        check_codes: check that codes lie in ``[0, K)`` and raise a ValueError otherwise. The
            check reads two numbers back to the host, a device sync on CUDA, so the default
            (``None``) checks host tensors only; on CUDA out-of-range codes are then ignored like
            non-finite rows (they take no part in the statistics and nothing is written out of
            bounds). ``True`` checks on every device (not under CUDA graphs), ``False`` never.
        backend: ``"auto"``/``None``, ``"triton"``, ``"interpret"`` or ``"torch"``.

    On CUDA, ``active_only`` without ``process_group`` and without ``deterministic`` runs steps
    1, 3 and 4 in a single cooperative kernel launch.

    Returns:
        bool ``(K,) / (L, K)``: the codes restarted by this step (on the device; no sync).

    ``B = 0`` without a process group is a documented no-op: nothing changes (counters included)
    and no code is restarted.
    """
    if dead_threshold is DEFAULT_FOR_SEMANTICS:
        dead_threshold = DEFAULT_THRESHOLDS.get(semantics) if isinstance(semantics, str) else None
    return EMA_UPDATE(
        x, codes, codebook, cluster_size, embed_sum, steps_since_active, candidates, decay=decay,
        eps=eps, semantics=semantics, dead_threshold=dead_threshold, deterministic=deterministic,
        check_codes=check_codes, generator=generator, process_group=process_group,
        backend=backend,
    )  # fmt: skip
