"""``ema_update_``'s eager plans: the update on any backend after validation, and the launches an
update binds once per call metadata."""

from __future__ import annotations

import torch

from triton_dispatch import uses_triton

from .op import code_statistics, ema_apply_functional_op, ema_apply_impl, ema_statistics_op
from .reference import gather_replacement_rows
from .validation import ResolvedUpdate, check_code_range, resolve_update


def apply_update(
    call, x, codes, codebook, cluster_size, embed_sum, steps_since_active, decay, eps, semantics,
    candidates, generator, deterministic, process_group, check_codes,
) -> torch.Tensor:  # fmt: skip
    """The update on any backend, after :func:`resolve_update`."""
    stacked, levels, batch, num_codes, dim, threshold, device, chosen = call
    if batch == 0 and process_group is None:
        return torch.zeros(cluster_size.shape, dtype=torch.bool, device=device)
    if check_codes is None:
        check_codes = device.type != "cuda"
    if check_codes:
        check_code_range(codes, num_codes)

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
            counts, sums = ema_statistics_op(x3, codes3, num_codes, bool(deterministic), chosen)
        else:
            counts, sums = code_statistics(x3, codes3, num_codes, bool(deterministic), chosen, True)
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
        *new_state, replaced = ema_apply_functional_op(cb3, size3, sum3, counter3, *apply_args)
        for t, new in zip((cb3, size3, sum3, counter3), new_state):
            t.copy_(new)
    else:
        replaced = ema_apply_impl(cb3, size3, sum3, counter3, *apply_args)
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
            op = ema_statistics_op if compiling else code_statistics
            c, s = op(x3, codes3, num_codes, deterministic, chosen)
            counts.copy_(c)
            sums.copy_(s)
    if dist.get_rank(group) == 0:
        rows.copy_(gather_replacement_rows(x3, cand3))
    dist.all_reduce(flat, group=group)  # on NCCL a wait of this stream, not of the host
    return counts, sums, rows


def _grouped_plan(call: ResolvedUpdate, draw, decay: float, eps: float):
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
            rows.view(levels, num_codes, dim).copy_(gather_replacement_rows(x3, lead(cand)))
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


def plan_update(
    x, codes, codebook, cluster_size, embed_sum, steps_since_active, decay, eps, semantics,
    dead_threshold, candidates, generator, deterministic, check_codes, backend, grouped=False,
):  # fmt: skip
    """The eager plan of a validated update. Active-only updates bind one launch: the
    small-batch kernel (no scratch, no zero-fill, no atomics) below its crossover, the cooperative
    scatter + epilogue kernel above it. Everything else runs :func:`apply_update`; an update
    over a process group (``grouped``) takes the group as a last argument of each call."""
    call = resolve_update(
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
        return apply_update(
            call, x, codes, codebook, cluster_size, embed_sum, steps, decay, eps, semantics,
            candidates, generator, deterministic, group, check_codes,
        )  # fmt: skip

    if not fast:
        return general

    check = check_codes if check_codes is not None else device.type != "cuda"
    shape = cluster_size.shape

    def draw(codes, steps, candidates, generator):
        if check:
            check_code_range(codes, num_codes)
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
