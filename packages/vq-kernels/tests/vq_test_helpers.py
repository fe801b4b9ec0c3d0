"""Shared builders for the EMA tests: random state and the float64 reference run."""

from __future__ import annotations

import os
import sys

import torch

from triton_dispatch.testing import assert_close, randint, randn
from vq_kernels.ops.ema_update.reference import ema_update_reference_


def make_state(levels, num_codes, dim, *, rng, semantics="active_only", device="cpu"):
    """Random EMA state (fp32) whose counters and sizes sit on both sides of the default
    thresholds, so that a step restarts some codes but not all."""
    codebook = randn((levels, num_codes, dim), generator=rng, device=device)
    if semantics == "active_only":
        size = torch.rand(levels, num_codes, generator=rng).to(device) * 3 + 0.1
    else:  # some above, some below the default expiry threshold of 2
        size = torch.rand(levels, num_codes, generator=rng).to(device) * 4
    embed_sum = randn((levels, num_codes, dim), generator=rng, device=device)
    counter = randint(0, 22, (levels, num_codes), generator=rng, device=device, dtype=torch.int32)
    return codebook, size, embed_sum, counter


def reference_step(x, codes, state, candidates, *, decay, eps=1e-5, semantics, threshold):
    """The float64 reference on copies of ``state``; returns (new state list, replaced)."""
    ref = [t.detach().to(torch.float64) if t.is_floating_point() else t.clone() for t in state]
    replaced = ema_update_reference_(
        x.detach().to(torch.float64),
        codes,
        *ref,
        candidates,
        decay=decay,
        eps=eps,
        semantics=semantics,
        threshold=threshold,
    )
    return ref, replaced


def assert_state_matches(state, ref, replaced, ref_replaced, *, tol=None):
    assert torch.equal(replaced.cpu(), ref_replaced.cpu()), "restarted codes differ"
    names = ("codebook", "cluster_size", "embed_sum")
    for name, out, want in zip(names, state[:3], ref[:3]):
        assert torch.isfinite(out).all(), f"{name} holds non-finite values"
        assert_close(out, want, dtype=torch.float32, tol=tol, name=name)
    assert torch.equal(state[3].cpu().long(), ref[3].cpu().long()), "steps_since_active differs"


def ddp_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """One rank of the gloo test: each rank quantizes its half of one batch with a process group;
    states are saved for the parent to compare."""
    import torch.distributed as dist

    from vq_kernels import ResidualVQ

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        data = torch.randn(2 * 24, 6, generator=torch.Generator().manual_seed(0))
        mine = data.chunk(world)[rank]
        torch.manual_seed(1)
        exact = ResidualVQ(
            6, 5, 2, backend="torch", dead_threshold=None, process_group=dist.group.WORLD
        )
        exact(mine)
        torch.manual_seed(2 + rank)  # different local draws: the broadcast must make them agree
        restarting = ResidualVQ(
            6,
            5,
            2,
            backend="torch",
            dead_threshold=1,
            kmeans_init=True,
            kmeans_iters=2,
            process_group=dist.group.WORLD,
        )
        restarting(mine)
        restarting(mine[:0] if rank == 1 else mine)  # a rank with an empty batch
        torch.save(
            {"exact": exact.state_dict(), "restarting": restarting.state_dict()},
            f"{out_dir}/rank{rank}.pt",
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Leave without C++ static destructors: gloo's worker threads can be torn down unjoined at
    # interpreter exit, which aborts the process (SIGABRT) after the work has succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
