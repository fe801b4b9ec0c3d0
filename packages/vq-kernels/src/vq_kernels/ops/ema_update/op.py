"""``ema_update_``'s two halves on every backend: the per-code statistics as the custom op
``vq_kernels::ema_statistics`` and the EMA epilogue as the functional custom op
``vq_kernels::ema_apply`` (fakes included), so they trace under ``torch.compile``; eager calls run
their bodies directly."""

from __future__ import annotations

import torch

from triton_dispatch import uses_triton

from .reference import ema_apply_reference_, ema_statistics_reference, reset_cluster_size


def code_statistics(
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
    return code_statistics(x, codes, num_codes, deterministic, backend)


ema_statistics_op = torch.library.custom_op("vq_kernels::ema_statistics", mutates_args=())(
    _ema_statistics_impl
)


@ema_statistics_op.register_fake
def _(x, codes, num_codes, deterministic, backend):
    levels, _, dim = x.shape
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty(levels, num_codes, dtype=dtype), x.new_empty(
        levels, num_codes, dim, dtype=dtype
    )


def ema_apply_impl(
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
    replaced = ema_apply_impl(
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
ema_apply_functional_op = torch.library.custom_op("vq_kernels::ema_apply", mutates_args=())(
    _ema_apply_functional_impl
)


@ema_apply_functional_op.register_fake
def _(codebook, cluster_size, embed_sum, steps_since_active, *rest):
    return (
        torch.empty_like(codebook),
        torch.empty_like(cluster_size),
        torch.empty_like(embed_sum),
        torch.empty_like(steps_since_active),
        cluster_size.new_empty(cluster_size.shape, dtype=torch.bool),
    )
