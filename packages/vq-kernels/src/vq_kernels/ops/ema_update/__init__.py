"""``ema_update_``: the fused in-place EMA codebook update with dead-code restarts."""

from __future__ import annotations

from typing import NamedTuple

import torch

from triton_dispatch import common_device, select_backend, uses_triton
from triton_dispatch.launch import PlanCache, call_key

from .._validation import (
    require_contiguous,
    require_float,
    require_integer,
    require_shape,
    require_tensor,
)
from .reference import (
    SEMANTICS,
    ema_apply_reference_,
    ema_statistics_reference,
    gather_replacement_rows,
    reset_cluster_size,
)

__all__ = ["DEFAULT_THRESHOLDS", "SEMANTICS", "ema_statistics", "ema_update_"]

#: Dead-code thresholds used when ``dead_threshold`` is left at its default: steps without an
#: assignment for ``active_only``, EMA cluster size for ``decay_all``.
DEFAULT_THRESHOLDS = {"active_only": 20, "decay_all": 2.0}

_DEFAULT = object()


def _statistics(
    x: torch.Tensor,
    codes: torch.Tensor,
    num_codes: int,
    deterministic: bool,
    backend: str,
    one_buffer: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``one_buffer``: counts and sums may be views of one allocation (one zero-fill launch, not
    two); a custom op's outputs must not alias, so only the eager path asks for it."""
    levels, batch, dim = x.shape
    if batch == 0 or num_codes == 0:
        return (
            x.new_zeros(levels, num_codes, dtype=torch.float32),
            x.new_zeros(levels, num_codes, dim, dtype=torch.float32),
        )
    if uses_triton(backend) and x.dtype != torch.float64:
        from .kernels import scatter_statistics, segment_statistics

        if deterministic:
            return segment_statistics(x.contiguous(), codes.contiguous(), num_codes)
        return scatter_statistics(x.contiguous(), codes.contiguous(), num_codes, one_buffer)
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return ema_statistics_reference(x, codes, num_codes, dtype=dtype)


def _ema_statistics_impl(
    x: torch.Tensor, codes: torch.Tensor, num_codes: int, deterministic: bool, backend: str
) -> tuple[torch.Tensor, torch.Tensor]:
    return _statistics(x, codes, num_codes, deterministic, backend)


_ema_statistics_op = torch.library.custom_op("vq_kernels::ema_statistics", mutates_args=())(
    _ema_statistics_impl
)


@_ema_statistics_op.register_fake
def _(x, codes, num_codes, deterministic, backend):
    levels, _, dim = x.shape
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty(levels, num_codes, dtype=dtype), x.new_empty(
        levels, num_codes, dim, dtype=dtype
    )


def _ema_apply_impl(
    codebook: torch.Tensor,
    cluster_size: torch.Tensor,
    embed_sum: torch.Tensor,
    steps_since_active: torch.Tensor,
    counts: torch.Tensor,
    sums: torch.Tensor,
    src: torch.Tensor,
    candidates: torch.Tensor,
    rows_per_level: int,
    decay: float,
    eps: float,
    semantics: str,
    threshold: float,
    has_threshold: bool,
    backend: str,
) -> torch.Tensor:
    thr = threshold if has_threshold else None
    if uses_triton(backend) and cluster_size.dtype == torch.float32:
        from .kernels import ema_epilogue

        replaced = ema_epilogue(
            codebook,
            cluster_size,
            embed_sum,
            steps_since_active,
            counts.to(torch.float32).contiguous(),
            sums.to(torch.float32).contiguous(),
            src.contiguous(),
            candidates.contiguous(),
            rows_per_level,
            decay=decay,
            eps=eps,
            semantics=semantics,
            threshold=thr,
            reset_size=reset_cluster_size(semantics, thr),
        )
        return replaced
    levels, num_codes, dim = codebook.shape
    offsets = torch.arange(levels, device=src.device)[:, None] * rows_per_level
    rows = src[(candidates.long() + offsets).reshape(-1)].view(levels, num_codes, dim)
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
        threshold=thr,
    )


def _ema_apply_functional_impl(
    codebook: torch.Tensor,
    cluster_size: torch.Tensor,
    embed_sum: torch.Tensor,
    steps_since_active: torch.Tensor,
    counts: torch.Tensor,
    sums: torch.Tensor,
    src: torch.Tensor,
    candidates: torch.Tensor,
    rows_per_level: int,
    decay: float,
    eps: float,
    semantics: str,
    threshold: float,
    has_threshold: bool,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    state = [t.clone() for t in (codebook, cluster_size, embed_sum, steps_since_active)]
    replaced = _ema_apply_impl(
        *state,
        counts,
        sums,
        src,
        candidates,
        rows_per_level,
        decay,
        eps,
        semantics,
        threshold,
        has_threshold,
        backend,
    )
    return (*state, replaced)


# The traced path: a functional op whose results the caller copies into the state. Inductor
# (torch 2.11) could reorder an in-place custom op's write to a module buffer before a gather from
# that buffer earlier in the program (the straight-through output read the updated codebook);
# a plain copy_ into the buffer is the input-mutation pattern it orders correctly.
_ema_apply_functional_op = torch.library.custom_op("vq_kernels::ema_apply", mutates_args=())(
    _ema_apply_functional_impl
)


@_ema_apply_functional_op.register_fake
def _(codebook, cluster_size, embed_sum, steps_since_active, *rest):
    return (
        torch.empty_like(codebook),
        torch.empty_like(cluster_size),
        torch.empty_like(embed_sum),
        torch.empty_like(steps_since_active),
        cluster_size.new_empty(cluster_size.shape, dtype=torch.bool),
    )


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
    require_tensor("x", x)
    require_tensor("codes", codes)
    require_float("x", x)
    require_integer("codes", codes)
    stacked = x.dim() == 3
    if x.dim() not in (2, 3) or codes.shape != x.shape[:-1]:
        raise ValueError(
            f"x must be (B, D) or (L, B, D) and codes x.shape[:-1]; got x {tuple(x.shape)}, "
            f"codes {tuple(codes.shape)}"
        )
    chosen = select_backend(device=common_device([x, codes], names=["x", "codes"]), backend=backend)
    counts, sums = _ema_statistics_op(
        x.detach() if stacked else x.detach().unsqueeze(0),
        codes if stacked else codes.unsqueeze(0),
        int(num_codes),
        bool(deterministic),
        chosen,
    )
    return (counts, sums) if stacked else (counts[0], sums[0])


def _check_threshold(semantics: str, dead_threshold) -> float | None:
    if dead_threshold is _DEFAULT:
        return float(DEFAULT_THRESHOLDS[semantics])
    if dead_threshold is None:
        return None
    if isinstance(dead_threshold, bool) or not isinstance(dead_threshold, (int, float)):
        raise TypeError(f"dead_threshold must be a number or None, got {dead_threshold!r}")
    if not dead_threshold > 0:
        raise ValueError(
            f"dead_threshold must be > 0 (or None to disable restarts), got {dead_threshold}: "
            "a threshold <= 0 would declare every code dead at every step"
        )
    return float(dead_threshold)


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
    dead_threshold: float | None = _DEFAULT,  # type: ignore[assignment]
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
    if not torch.compiler.is_compiling():
        key = call_key(
            (x, codes, codebook, cluster_size, embed_sum, steps_since_active, candidates),
            decay, eps, semantics, dead_threshold, deterministic, check_codes, backend,
            None if generator is None else generator.device, process_group is None,
        )  # fmt: skip
        if key is not None:
            plan = _PLANS.get(
                key,
                lambda: _plan_update(
                    x,
                    codes,
                    codebook,
                    cluster_size,
                    embed_sum,
                    steps_since_active,
                    decay,
                    eps,
                    semantics,
                    dead_threshold,
                    candidates,
                    generator,
                    deterministic,
                    check_codes,
                    backend,
                    process_group is not None,
                ),
            )
            if process_group is not None:
                return plan(
                    x, codes, codebook, cluster_size, embed_sum, steps_since_active, candidates,
                    generator, process_group,
                )  # fmt: skip
            return plan(
                x,
                codes,
                codebook,
                cluster_size,
                embed_sum,
                steps_since_active,
                candidates,
                generator,
            )
    call = _resolve_update(
        x, codes, codebook, cluster_size, embed_sum, steps_since_active, decay, eps, semantics,
        dead_threshold, candidates, generator, backend,
    )  # fmt: skip
    return _apply_update(
        call, x, codes, codebook, cluster_size, embed_sum, steps_since_active, decay, eps,
        semantics, candidates, generator, deterministic, process_group, check_codes,
    )  # fmt: skip


_PLANS: PlanCache = PlanCache("vq_kernels.ema_update_")


class _Update(NamedTuple):
    """A validated update: sizes, the restart threshold, device and backend."""

    stacked: bool
    levels: int
    batch: int
    num_codes: int
    dim: int
    threshold: float | None
    device: torch.device
    chosen: str


def _resolve_update(
    x, codes, codebook, cluster_size, embed_sum, steps_since_active, decay, eps, semantics,
    dead_threshold, candidates, generator, backend,
) -> _Update:  # fmt: skip
    """Every check that needs only metadata; the clear errors of :func:`ema_update_`."""
    for name, t in (
        ("x", x),
        ("codes", codes),
        ("codebook", codebook),
        ("cluster_size", cluster_size),
        ("embed_sum", embed_sum),
    ):
        require_tensor(name, t)
    if semantics not in SEMANTICS:
        raise ValueError(f"semantics must be one of {SEMANTICS}, got {semantics!r}")
    threshold = _check_threshold(semantics, dead_threshold)
    if not isinstance(decay, (int, float)) or not 0.0 <= float(decay) <= 1.0:
        raise ValueError(f"decay must be a number in [0, 1], got {decay!r}")
    if not isinstance(eps, (int, float)) or not float(eps) > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    if x.dim() not in (2, 3):
        raise ValueError(f"x must be (B, D) or (L, B, D), got shape {tuple(x.shape)}")
    stacked = x.dim() == 3
    require_float("x", x)
    require_integer("codes", codes)
    require_float("codebook", codebook)
    require_float("cluster_size", cluster_size, (torch.float32, torch.float64))
    require_float("embed_sum", embed_sum, (cluster_size.dtype,))
    lead = x.shape[:1] if stacked else ()
    dim = x.shape[-1]
    batch = x.shape[-2]
    if codebook.dim() != x.dim() or codebook.shape[:-2] != lead or codebook.shape[-1] != dim:
        want = "(L, K, D)" if stacked else "(K, D)"
        raise ValueError(
            f"codebook must have shape {want} matching x {tuple(x.shape)} (D = {dim}), "
            f"got {tuple(codebook.shape)}"
        )
    num_codes = codebook.shape[-2]
    levels = x.shape[0] if stacked else 1
    require_shape("codes", codes, (*lead, batch), "(L, B)" if stacked else "(B,)")
    require_shape("cluster_size", cluster_size, (*lead, num_codes), "(L, K)" if stacked else "(K,)")
    require_shape(
        "embed_sum", embed_sum, (*lead, num_codes, dim), "(L, K, D)" if stacked else "(K, D)"
    )
    if steps_since_active is not None:
        require_tensor("steps_since_active", steps_since_active)
        require_integer("steps_since_active", steps_since_active)
        require_shape(
            "steps_since_active",
            steps_since_active,
            (*lead, num_codes),
            "(L, K)" if stacked else "(K,)",
        )
    elif semantics == "active_only" and threshold is not None:
        raise ValueError(
            "steps_since_active is required for semantics='active_only' with restarts "
            "(pass an int tensor of zeros of shape (K,) / (L, K), or dead_threshold=None)"
        )
    if candidates is not None:
        require_tensor("candidates", candidates)
        require_integer("candidates", candidates)
        require_shape("candidates", candidates, (*lead, num_codes), "(L, K)" if stacked else "(K,)")
    tensors = [x, codes, codebook, cluster_size, embed_sum, steps_since_active, candidates]
    names = [
        "x",
        "codes",
        "codebook",
        "cluster_size",
        "embed_sum",
        "steps_since_active",
        "candidates",
    ]
    device = common_device(tensors, names=names)
    if generator is not None and torch.device(generator.device).type != device.type:
        raise ValueError(f"generator is on {generator.device} but the tensors are on {device}")
    for name, t in zip(names[2:6], tensors[2:6]):
        if t is not None:
            require_contiguous(name, t)
    chosen = select_backend(device=device, backend=backend)
    return _Update(stacked, levels, batch, num_codes, dim, threshold, device, chosen)


def _apply_update(
    call, x, codes, codebook, cluster_size, embed_sum, steps_since_active, decay, eps, semantics,
    candidates, generator, deterministic, process_group, check_codes,
) -> torch.Tensor:  # fmt: skip
    """The update on any backend, after :func:`_resolve_update`."""
    stacked, levels, batch, num_codes, dim, threshold, device, chosen = call
    if batch == 0 and process_group is None:
        return torch.zeros(cluster_size.shape, dtype=torch.bool, device=device)
    if check_codes is None:
        check_codes = device.type != "cuda"
    if check_codes:
        _check_code_range(codes, num_codes)

    x3 = x.detach() if stacked else x.detach().unsqueeze(0)
    codes3 = codes if stacked else codes.unsqueeze(0)
    target = codebook.detach() if codebook.requires_grad else codebook
    cb3 = target if stacked else target.unsqueeze(0)
    size3 = cluster_size if stacked else cluster_size.unsqueeze(0)
    sum3 = embed_sum if stacked else embed_sum.unsqueeze(0)
    if steps_since_active is None:
        counter3 = torch.zeros(levels, num_codes, dtype=torch.int32, device=device)
    else:
        counter3 = steps_since_active if stacked else steps_since_active.unsqueeze(0)

    if threshold is None:
        # Never read as a row index without restarts; the kernels only need an int tensor there.
        cand3 = (
            counter3
            if uses_triton(chosen) and cluster_size.dtype == torch.float32
            else torch.zeros(levels, num_codes, dtype=torch.int64, device=device)
        )
    elif candidates is not None:
        cand3 = (
            (candidates if stacked else candidates.unsqueeze(0)).long().clamp(0, max(batch - 1, 0))
        )
    else:
        cand3 = torch.randint(
            0, max(batch, 1), (levels, num_codes), generator=generator, device=device
        )

    # Eager calls skip the custom-op dispatcher (tens of microseconds per call); traced calls need
    # the registered ops.
    compiling = torch.compiler.is_compiling()
    if (
        chosen == "triton"
        and not compiling
        and process_group is None
        and not deterministic
        and semantics == "active_only"
        and x.dtype != torch.float64
        and cluster_size.dtype == torch.float32
    ):
        # The common training update: statistics and epilogue in one cooperative launch.
        from .kernels import fused_update

        replaced = fused_update(
            x3.contiguous(),
            codes3.contiguous(),
            cb3,
            size3,
            sum3,
            counter3,
            cand3,
            decay=float(decay),
            eps=float(eps),
            threshold=threshold,
        )
        return replaced if stacked else replaced[0]
    if process_group is not None:
        counts, sums, rows = _group_statistics(
            x3, codes3, cand3, num_codes, bool(deterministic), chosen, process_group, compiling
        )
        cand3 = torch.arange(num_codes, device=device).expand(levels, num_codes).contiguous()
        rows_per_level = num_codes
        src = rows.to(sum3.dtype).view(levels * num_codes, dim)
    else:
        if compiling:
            counts, sums = _ema_statistics_op(x3, codes3, num_codes, bool(deterministic), chosen)
        else:
            counts, sums = _statistics(x3, codes3, num_codes, bool(deterministic), chosen, True)
        src = x3.contiguous().view(levels * batch, dim)
        rows_per_level = batch
    apply_args = (
        counts,
        sums,
        src,
        cand3,
        rows_per_level,
        float(decay),
        float(eps),
        semantics,
        float(threshold) if threshold is not None else 0.0,
        threshold is not None,
        chosen,
    )
    if compiling:
        *new_state, replaced = _ema_apply_functional_op(cb3, size3, sum3, counter3, *apply_args)
        for t, new in zip((cb3, size3, sum3, counter3), new_state):
            t.copy_(new)
    else:
        replaced = _ema_apply_impl(cb3, size3, sum3, counter3, *apply_args)
    return replaced if stacked else replaced[0]


def _group_statistics(x3, codes3, cand3, num_codes, deterministic, chosen, group, compiling):
    """Counts, sums and restart rows of every level in one flat buffer, summed over ``group`` by
    a single all-reduce. Only group rank 0 writes its rows; the others add zeros, so
    the sum hands every rank rank 0's rows bit for bit, as a broadcast would, without a second
    collective. Returns ``(counts, sums, rows)``.
    """
    import torch.distributed as dist

    levels, batch, dim = x3.shape
    lk = levels * num_codes
    dtype = torch.float64 if x3.dtype == torch.float64 else torch.float32
    flat = torch.zeros(lk * (2 * dim + 1), device=x3.device, dtype=dtype)
    counts = flat[:lk].view(levels, num_codes)
    sums = flat[lk : lk * (dim + 1)].view(levels, num_codes, dim)
    rows = flat[lk * (dim + 1) :].view(levels, num_codes, dim)
    if batch > 0:
        if uses_triton(chosen) and dtype == torch.float32 and not deterministic and not compiling:
            from .kernels import scatter_statistics_into

            scatter_statistics_into(x3.contiguous(), codes3.contiguous(), counts, sums)
        else:
            op = _ema_statistics_op if compiling else _statistics
            c, s = op(x3, codes3, num_codes, deterministic, chosen)
            counts.copy_(c)
            sums.copy_(s)
    if dist.get_rank(group) == 0:
        rows.copy_(gather_replacement_rows(x3, cand3))
    dist.all_reduce(flat, group=group)  # on NCCL a wait of this stream, not of the host
    return counts, sums, rows


def _grouped_plan(call: _Update, draw, decay: float, eps: float):
    """The eager plan of an active-only update over a process group: two bound launches around
    one all-reduce. The scatter adds this rank's counts and sums into one flat buffer, group rank
    0 writes its restart rows into it (the others leave zeros: the sum is then a broadcast of
    rank 0's rows), the all-reduce sums the buffer, and the epilogue reads everything from it.
    Nothing is resolved per call beyond the group's rank."""
    import torch.distributed as dist

    from .kernels import grouped_update_launches

    stacked, levels, batch, num_codes, dim, threshold, device, _ = call
    scatter, epilogue = grouped_update_launches(
        levels, batch, num_codes, dim, device, decay, eps, threshold
    )
    lk = levels * num_codes
    # the layout of _group_statistics' buffer: a rank on that path (B = 0, say) joins the same
    # all-reduce
    size = lk * (2 * dim + 1)
    level_start = torch.arange(levels, device=device)[:, None] * batch
    slots = torch.arange(num_codes, device=device, dtype=torch.int32).expand(levels, -1)
    slots = slots.contiguous()
    lead = (lambda t: t) if stacked else (lambda t: t.unsqueeze(0))
    shape = (levels, num_codes) if stacked else (num_codes,)

    def grouped(x, codes, codebook, cluster_size, embed_sum, steps, candidates, generator, group):
        cand = draw(codes, steps, candidates, generator)
        x3 = lead(x)
        flat = torch.zeros(size, device=device, dtype=torch.float32)
        counts, sums = flat[:lk], flat[lk : lk * (dim + 1)]
        scatter(x3, lead(codes), counts, sums)
        rows = flat[lk * (dim + 1) :]
        if threshold is not None and dist.get_rank(group) == 0:
            index = (lead(cand).long().clamp(0, batch - 1) + level_start).view(-1)
            rows.view(lk, dim).copy_(x3.reshape(levels * batch, dim).index_select(0, index))
        # synchronous: on NCCL only this stream waits for the collective, while an async work's
        # wait() measured as a host wait (the step lost its overlap of host and GPU)
        dist.all_reduce(flat, group=group)
        replaced = torch.empty(shape, dtype=torch.bool, device=device)
        epilogue(
            codebook, cluster_size, embed_sum, steps, counts, sums, cluster_size, rows, slots,
            replaced,
        )  # fmt: skip
        return replaced

    return grouped


def _check_code_range(codes: torch.Tensor, num_codes: int) -> None:
    """The opt-in value check (reads two numbers back: a device sync on CUDA)."""
    if codes.numel() > 0:
        low, high = int(codes.min()), int(codes.max())
        if low < 0 or high >= num_codes:
            raise ValueError(
                f"codes must lie in [0, K) = [0, {num_codes}); got values in [{low}, {high}]"
            )


def _plan_update(
    x, codes, codebook, cluster_size, embed_sum, steps_since_active, decay, eps, semantics,
    dead_threshold, candidates, generator, deterministic, check_codes, backend, grouped=False,
):  # fmt: skip
    """The eager plan of a validated update. Active-only updates bind one launch: the
    small-batch kernel (no scratch, no zero-fill, no atomics) below its crossover, the cooperative
    scatter + epilogue kernel above it. Everything else runs :func:`_apply_update`; an update
    over a process group (``grouped``) takes the group as a last argument of each call."""
    call = _resolve_update(
        x, codes, codebook, cluster_size, embed_sum, steps_since_active, decay, eps, semantics,
        dead_threshold, candidates, generator, backend,
    )  # fmt: skip
    _, levels, batch, num_codes, dim, threshold, device, chosen = call
    from .kernels import small_update_fits, small_update_launch

    fast = (
        uses_triton(chosen)
        and semantics == "active_only"
        and not deterministic
        and x.dtype != torch.float64
        and cluster_size.dtype == torch.float32
        and steps_since_active is not None
        and batch > 0
        and x.is_contiguous()
        and codes.is_contiguous()
        and (candidates is None or candidates.is_contiguous())
    )

    def general(
        x, codes, codebook, cluster_size, embed_sum, steps, candidates, generator, group=None
    ):
        return _apply_update(
            call, x, codes, codebook, cluster_size, embed_sum, steps, decay, eps, semantics,
            candidates, generator, deterministic, group, check_codes,
        )  # fmt: skip

    if not fast:
        return general

    check = check_codes if check_codes is not None else device.type != "cuda"
    shape = cluster_size.shape

    def draw(codes, steps, candidates, generator):
        if check:
            _check_code_range(codes, num_codes)
        if threshold is None:
            return steps  # never read as a row index without restarts
        if candidates is None:
            return torch.randint(0, batch, shape, generator=generator, device=device)
        return candidates  # clamped into [0, B) by the kernels

    if grouped:
        return _grouped_plan(call, draw, decay, eps)
    if small_update_fits(batch, num_codes, dim):
        launch = small_update_launch(levels, batch, num_codes, dim, device, decay, eps, threshold)

        def small(x, codes, codebook, cluster_size, embed_sum, steps, candidates, generator):
            cand = draw(codes, steps, candidates, generator)
            replaced = torch.empty(shape, dtype=torch.bool, device=device)
            launch(x, codes, codebook, cluster_size, embed_sum, steps, cand, replaced)
            return replaced

        return small
    if chosen != "triton":  # the interpreter runs programs one by one: no grid barrier there
        return general

    from .kernels import fused_update, fused_update_launch, fused_update_scratch

    settings = dict(decay=float(decay), eps=float(eps), threshold=threshold)
    bound: list = [None]  # the kernel's launch, once a first update has compiled it

    def cooperative(x, codes, codebook, cluster_size, embed_sum, steps, candidates, generator):
        cand = draw(codes, steps, candidates, generator)
        launch = bound[0]
        if launch is None:
            lead = (lambda t: t) if x.dim() == 3 else (lambda t: t.unsqueeze(0))
            state = [lead(t) for t in (x, codes, codebook, cluster_size, embed_sum, steps, cand)]
            replaced = fused_update(*state, **settings)
            bound[0] = fused_update_launch(*state[:3], state[5], **settings)
            return replaced.view(shape)
        scratch = fused_update_scratch(levels, num_codes, dim, device)
        replaced = torch.empty(shape, dtype=torch.bool, device=device)
        launch(x, codes, scratch, codebook, cluster_size, embed_sum, steps, cand, replaced)
        return replaced

    return cooperative
