"""The plans of ``vq_kernels::ema_statistics`` and ``vq_kernels::ema_update``: per kind of call,
the launches bound once; and the general update on any backend (the reference route)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from triton_dispatch import uses_triton

from .reference import (
    ema_apply_reference_,
    ema_statistics_reference,
    gather_replacement_rows,
    reset_cluster_size,
)
from .validation import check_code_range


def _lead(t):
    """``t`` with the level dimension of a stacked call (a view of one-level ``t``)."""
    return None if t is None else t.unsqueeze(0)


def code_statistics(x3, codes3, num_codes, deterministic, backend, one_buffer=False):
    """Counts ``(L, K)`` and sums ``(L, K, D)`` of stacked ``x3``; ``one_buffer``: both may be
    views of one allocation (one zero-fill launch, not two); an op's outputs must not alias, so
    only the update asks for it."""
    levels, batch, dim = x3.shape
    if batch == 0 or num_codes == 0:
        return (
            x3.new_zeros(levels, num_codes, dtype=torch.float32),
            x3.new_zeros(levels, num_codes, dim, dtype=torch.float32),
        )
    if uses_triton(backend) and x3.dtype != torch.float64:
        from .kernels import scatter_statistics, segment_statistics

        if deterministic:
            return segment_statistics(x3.contiguous(), codes3.contiguous(), num_codes)
        return scatter_statistics(x3.contiguous(), codes3.contiguous(), num_codes, one_buffer)
    dtype = torch.float64 if x3.dtype == torch.float64 else torch.float32
    return ema_statistics_reference(x3, codes3, num_codes, dtype=dtype)


def statistics_reference(x, codes, *, num_codes, deterministic, backend="torch"):
    """``ema_statistics`` of ``x (B, D) / (L, B, D)`` on any backend."""
    if x.dim() == 3:
        return code_statistics(x, codes, num_codes, deterministic, backend)
    counts, sums = code_statistics(_lead(x), _lead(codes), num_codes, deterministic, backend)
    return counts[0], sums[0]


def statistics_plan(call):
    """The kernels' statistics (the reference runs float64 and empty calls)."""
    x, num_codes, deterministic = call["x"], call["num_codes"], call["deterministic"]
    backend = call.backend
    if x.dtype == torch.float64 or x.shape[-2] == 0 or num_codes == 0:
        return None
    return SimpleNamespace(
        forward=lambda x, codes: statistics_reference(
            x, codes, num_codes=num_codes, deterministic=deterministic, backend=backend
        )
    )


def _epilogue(state3, counts, sums, src, candidates, rows_per_level, *, backend, **settings):
    """The EMA blend, refresh and restarts of stacked ``state3`` in place: the kernel, or the
    reference reading replacement row ``candidates[l, k]`` of level ``l`` of ``src``."""
    codebook, cluster_size = state3[0], state3[1]
    if uses_triton(backend) and cluster_size.dtype == torch.float32:
        from .kernels import ema_epilogue

        cast = [t.to(torch.float32).contiguous() for t in (counts, sums)]
        return ema_epilogue(
            *state3, *cast, src.contiguous(), candidates.contiguous(), rows_per_level, **settings,
            reset_size=reset_cluster_size(settings["semantics"], settings["threshold"]),
        )  # fmt: skip
    levels, num_codes, dim = codebook.shape
    offsets = torch.arange(levels, device=src.device)[:, None] * rows_per_level
    rows = src[(candidates.long() + offsets).reshape(-1)].view(levels, num_codes, dim)
    return ema_apply_reference_(*state3, counts, sums, rows, **settings)


def apply_update(
    x, codes, codebook, cluster_size, embed_sum, steps_since_active, candidates, *, decay, eps,
    semantics, dead_threshold, deterministic, check_codes, generator=None, process_group=None,
    backend="torch",
) -> torch.Tensor:  # fmt: skip
    """The update on any backend (``"torch"``: the reference route), candidates already drawn."""
    device, threshold = codebook.device, dead_threshold
    if x.shape[-2] == 0 and process_group is None:
        return torch.zeros(cluster_size.shape, dtype=torch.bool, device=device)
    num_codes = codebook.shape[-2]
    if check_codes is None:
        check_codes = device.type != "cuda"
    if check_codes:
        check_code_range(codes, num_codes)
    stacked = x.dim() == 3
    lead = (lambda t: t) if stacked else _lead
    x3, codes3, cand3 = lead(x.detach()), lead(codes), lead(candidates)
    levels, batch, dim = x3.shape
    state3 = [lead(t) for t in (codebook.detach(), cluster_size, embed_sum, steps_since_active)]
    if steps_since_active is None:
        state3[3] = torch.zeros(levels, num_codes, dtype=torch.int32, device=device)
    state_fp32 = cluster_size.dtype == torch.float32
    if threshold is None:  # never read as a row index without restarts: any int tensor does
        cand3 = state3[3] if uses_triton(backend) and state_fp32 else None
        if cand3 is None:
            cand3 = torch.zeros(levels, num_codes, dtype=torch.int64, device=device)
    else:
        cand3 = cand3.long().clamp(0, max(batch - 1, 0))
    if (
        backend == "triton" and process_group is None and not deterministic
        and semantics == "active_only" and x.dtype != torch.float64 and state_fp32
    ):  # fmt: skip
        # The common training update: statistics and epilogue in one cooperative launch.
        from .kernels import fused_update

        replaced = fused_update(
            x3.contiguous(), codes3.contiguous(), *state3, cand3, decay=float(decay),
            eps=float(eps), threshold=threshold,
        )  # fmt: skip
        return replaced if stacked else replaced[0]
    if process_group is not None:
        counts, sums, rows = _group_statistics(
            x3, codes3, cand3, num_codes, deterministic, backend, process_group
        )
        cand3 = torch.arange(num_codes, device=device).expand(levels, num_codes).contiguous()
        rows_per_level, src = num_codes, rows.to(state3[2].dtype).view(levels * num_codes, dim)
    else:
        counts, sums = code_statistics(x3, codes3, num_codes, deterministic, backend, True)
        rows_per_level, src = batch, x3.contiguous().view(levels * batch, dim)
    replaced = _epilogue(
        state3, counts, sums, src, cand3, rows_per_level, backend=backend, decay=float(decay),
        eps=float(eps), semantics=semantics, threshold=threshold,
    )  # fmt: skip
    return replaced if stacked else replaced[0]


def _group_statistics(x3, codes3, cand3, num_codes, deterministic, backend, group):
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
        if uses_triton(backend) and dtype == torch.float32 and not deterministic:
            from .kernels import scatter_statistics_into

            scatter_statistics_into(x3.contiguous(), codes3.contiguous(), counts, sums)
        else:
            c, s = code_statistics(x3, codes3, num_codes, deterministic, backend)
            counts.copy_(c)
            sums.copy_(s)
    if dist.get_rank(group) == 0:
        rows.copy_(gather_replacement_rows(x3, cand3))
    dist.all_reduce(flat, group=group)  # on NCCL a wait of this stream, not of the host
    return counts, sums, rows


def _grouped_plan(call, draw):
    """The eager plan of an active-only update over a process group: two bound launches around
    one all-reduce. The scatter adds this rank's counts and sums into one flat buffer, group rank
    0 writes its restart rows into it (the others leave zeros: the sum is then a broadcast of
    rank 0's rows), the all-reduce sums the buffer, and the epilogue reads everything from it.
    Nothing is resolved per call beyond the group's rank."""
    import torch.distributed as dist

    from .kernels import grouped_update_launches

    x, cluster_size, threshold = call["x"], call["cluster_size"], call["dead_threshold"]
    levels, (batch, dim) = x.shape[0] if x.dim() == 3 else 1, x.shape[-2:]
    num_codes, device = cluster_size.shape[-1], call.device
    scatter, epilogue = grouped_update_launches(
        levels, batch, num_codes, dim, device, call["decay"], call["eps"], threshold
    )
    lk = levels * num_codes
    # the layout of _group_statistics' buffer: a rank on that path (B = 0, say) joins the same
    # all-reduce
    size = lk * (2 * dim + 1)
    slots = torch.arange(num_codes, device=device, dtype=torch.int32).expand(levels, -1)
    slots = slots.contiguous()
    lead = (lambda t: t) if x.dim() == 3 else _lead

    def grouped(x, codes, codebook, cluster_size, embed_sum, steps, candidates, *, generator=None,
                process_group=None):  # fmt: skip
        cand = draw(codes, steps, candidates)
        x3 = lead(x)
        flat = torch.zeros(size, device=device, dtype=torch.float32)
        counts, sums = flat[:lk], flat[lk : lk * (dim + 1)]
        scatter(x3, lead(codes), counts, sums)
        rows = flat[lk * (dim + 1) :]
        if threshold is not None and dist.get_rank(process_group) == 0:
            rows.view(levels, num_codes, dim).copy_(gather_replacement_rows(x3, lead(cand)))
        # synchronous: on NCCL only this stream waits for the collective, while an async work's
        # wait() measured as a host wait (the step lost its overlap of host and GPU)
        dist.all_reduce(flat, group=process_group)
        replaced = torch.empty(cluster_size.shape, dtype=torch.bool, device=device)
        epilogue(
            codebook, cluster_size, embed_sum, steps, counts, sums, cluster_size, rows, slots,
            replaced,
        )  # fmt: skip
        return replaced

    return SimpleNamespace(forward=grouped)


def update_plan(call):
    """The eager plan of a validated update. Active-only updates bind one launch: the
    small-batch kernel (no scratch, no zero-fill, no atomics) below its crossover, the cooperative
    scatter + epilogue kernel above it; over a process group, the grouped launches. Everything
    else runs :func:`apply_update` on the call's backend; an empty batch without a group is the
    reference's no-op (``None``)."""
    x, codes, cluster_size = call["x"], call["codes"], call["cluster_size"]
    grouped, backend = call.passed["process_group"] is not None, call.backend
    batch, num_codes, dim = x.shape[-2], cluster_size.shape[-1], x.shape[-1]
    if batch == 0 and not grouped:
        return None
    settings = {n: call[n] for n in ("decay", "eps", "semantics", "dead_threshold")}
    settings.update(deterministic=call["deterministic"], check_codes=call["check_codes"])
    fast = (
        settings["semantics"] == "active_only"
        and not call["deterministic"]
        and x.dtype != torch.float64
        and cluster_size.dtype == torch.float32
        and call["steps_since_active"] is not None
        and batch > 0
        and x.is_contiguous()
        and codes.is_contiguous()
        and (call["candidates"] is None or call["candidates"].is_contiguous())
    )
    if not fast:

        def general(*tensors, generator=None, process_group=None):
            return apply_update(*tensors, **settings, process_group=process_group, backend=backend)

        return SimpleNamespace(forward=general)

    check = call["check_codes"] if call["check_codes"] is not None else call.device.type != "cuda"
    threshold, device, shape = call["dead_threshold"], call.device, cluster_size.shape

    def draw(codes, steps, candidates):
        if check:
            check_code_range(codes, num_codes)
        # never read as a row index without restarts; made candidates lie in [0, B), given ones
        # are clamped into it by the kernels
        return steps if threshold is None else candidates

    if grouped:
        return _grouped_plan(call, draw)
    from .kernels import small_update_fits, small_update_launch

    levels = x.shape[0] if x.dim() == 3 else 1
    decay, eps = call["decay"], call["eps"]
    if small_update_fits(batch, num_codes, dim):
        launch = small_update_launch(levels, batch, num_codes, dim, device, decay, eps, threshold)

        def small(x, codes, codebook, cluster_size, embed_sum, steps, candidates, **passed):
            cand = draw(codes, steps, candidates)
            replaced = torch.empty(shape, dtype=torch.bool, device=device)
            launch(x, codes, codebook, cluster_size, embed_sum, steps, cand, replaced)
            return replaced

        return SimpleNamespace(forward=small)
    if backend != "triton":  # the interpreter runs programs one by one: no grid barrier
        return SimpleNamespace(
            forward=lambda *tensors, **passed: apply_update(*tensors, **settings, backend=backend)
        )

    from .kernels import fused_update, fused_update_launch, fused_update_scratch

    fused = dict(decay=float(decay), eps=float(eps), threshold=threshold)
    bound: list = [None]  # the kernel's launch, once a first update has compiled it

    def cooperative(x, codes, codebook, cluster_size, embed_sum, steps, candidates, **passed):
        cand = draw(codes, steps, candidates)
        launch = bound[0]
        if launch is None:
            lead = (lambda t: t) if x.dim() == 3 else _lead
            state = [lead(t) for t in (x, codes, codebook, cluster_size, embed_sum, steps, cand)]
            replaced = fused_update(*state, **fused)
            bound[0] = fused_update_launch(*state[:3], state[5], **fused)
            return replaced.view(shape)
        scratch = fused_update_scratch(levels, num_codes, dim, device)
        replaced = torch.empty(shape, dtype=torch.bool, device=device)
        launch(x, codes, scratch, codebook, cluster_size, embed_sum, steps, cand, replaced)
        return replaced

    return SimpleNamespace(forward=cooperative)
