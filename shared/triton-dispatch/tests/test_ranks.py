"""The multi-process kit: results come back rank by rank, a failing rank ends the run with its
traceback instead of leaving the others waiting in a collective."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from triton_dispatch.testing import RankFailed, run_ranks


def sum_of_ranks(rank: int, world: int, scale: float) -> dict:
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    gathered = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(gathered, torch.full((2,), float(rank)))
    return {"rank": rank, "world": world, "sum": t * scale, "gathered": torch.stack(gathered)}


def one_rank_raises(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("bad shard on purpose")
    dist.all_reduce(torch.ones(1))  # would wait for rank 1 for ever


def test_results_come_back_rank_by_rank():
    out = run_ranks(sum_of_ranks, 3, 2.0)
    assert [o["rank"] for o in out] == [0, 1, 2] and all(o["world"] == 3 for o in out)
    for o in out:
        assert torch.equal(o["sum"], torch.tensor([12.0]))
        assert torch.equal(o["gathered"], torch.arange(3.0)[:, None].expand(3, 2))


def test_a_raising_rank_ends_the_run_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(RankFailed, match="rank 1 of 2 raised") as info:
        run_ranks(one_rank_raises, 2, timeout=60)
    assert info.value.rank == 1
    assert "ValueError: bad shard on purpose" in info.value.remote_traceback
    assert time.monotonic() - start < 40  # not the 60 s timeout


def test_timeout_and_bad_arguments():
    with pytest.raises(RankFailed, match="timed out"):
        run_ranks(sum_of_ranks, 1, 1.0, timeout=0.2)
    with pytest.raises(ValueError, match="world_size"):
        run_ranks(sum_of_ranks, 0)
    with pytest.raises(ValueError, match="backend"):
        run_ranks(sum_of_ranks, 1, backend="mpi")
    with pytest.raises(TypeError, match="module-level"):
        run_ranks(lambda r, w: None, 1)


def nccl_all_gather(rank: int, world: int) -> torch.Tensor:
    out = [torch.empty(3, device="cuda") for _ in range(world)]
    dist.all_gather(out, torch.full((3,), float(rank), device="cuda"))
    return torch.stack(out).cpu()


@pytest.mark.gpu
@pytest.mark.multigpu
def test_nccl_ranks_one_gpu_each():
    for got in run_ranks(nccl_all_gather, 2, backend="nccl", timeout=120):
        assert torch.equal(got, torch.arange(2.0)[:, None].expand(2, 3))
