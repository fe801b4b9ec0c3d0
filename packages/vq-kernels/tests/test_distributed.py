"""Statistics over a process group: three gloo ranks with uneven shards (one of them empty) must
end bit-identical and equal to one process on the concatenated batch; a rank that raises must
end the run with its error instead of leaving the others waiting in the collective."""

from __future__ import annotations

import pytest
import torch

from triton_dispatch.testing import run_ranks
from vq_kernels import ResidualVQ, ema_update_

WORLD = 3
SHARDS = (7, 0, 5)  # uneven, and rank 1 has no rows
LEVELS, CODES, DIM = 2, 5, 6
BACKENDS = ("torch", None)  # None: the kernels (interpreted when TRITON_INTERPRET=1)


def _data() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(LEVELS, sum(SHARDS), DIM, generator=g)
    codes = torch.randint(0, CODES, (LEVELS, sum(SHARDS)), generator=g)
    codes[:, :3] = 0  # a busy code, and some codes no row uses
    state = (
        torch.randn(LEVELS, CODES, DIM, generator=g),
        torch.rand(LEVELS, CODES, generator=g) * 3,
        torch.randn(LEVELS, CODES, DIM, generator=g),
        torch.randint(0, 3, (LEVELS, CODES), generator=g, dtype=torch.int32),
    )
    # restart rows index rank 0's shard, which leads the concatenated batch
    candidates = torch.randint(0, SHARDS[0], (LEVELS, CODES), generator=g)
    return x, codes, state, candidates


def _module_data() -> torch.Tensor:
    return torch.randn(sum(SHARDS), DIM, generator=torch.Generator().manual_seed(1))


def _updates(x, codes, group, backend):
    """Each semantics (with restarts) on fresh copies of the state; returns state + flags."""
    _, _, state, candidates = _data()
    results = {}
    for semantics, threshold in (("active_only", 1), ("decay_all", 2.0)):
        mine = [t.clone() for t in state]
        replaced = ema_update_(
            x, codes, *mine, decay=0.9, semantics=semantics, dead_threshold=threshold,
            candidates=candidates, process_group=group, backend=backend,
        )  # fmt: skip
        results[semantics] = [*mine, replaced]
    return results


def _modules(data, group, backend):
    torch.manual_seed(1)
    exact = ResidualVQ(
        DIM, CODES, LEVELS, dead_threshold=None, process_group=group, backend=backend
    )
    outs = [exact(data) for _ in range(2)]
    return exact.state_dict(), [(o.codes, o.loss) for o in outs]


def _worker(rank: int, world: int) -> dict:
    import torch.distributed as dist

    group = dist.group.WORLD
    start = sum(SHARDS[:rank])
    mine = slice(start, start + SHARDS[rank])
    x, codes, _, _ = _data()
    out = {}
    for backend in BACKENDS:
        out[f"op {backend}"] = _updates(x[:, mine], codes[:, mine], group, backend)
    out["module"], outputs = _modules(_module_data()[mine], group, None)
    # k-means init on every rank, then restarts whose rows come from rank 0 alone
    torch.manual_seed(2 + rank)  # different local draws: ranks must still agree
    restarting = ResidualVQ(
        DIM, CODES, LEVELS, dead_threshold=1, kmeans_init=True, kmeans_iters=2, process_group=group
    )
    restarting(_module_data()[: 6 + rank])
    restarting(_module_data()[mine])
    out["restarting"] = restarting.state_dict()
    # a learned codebook restarts too: summed usage, rows from rank 0, replicas identical
    torch.manual_seed(5 + rank)
    learned = ResidualVQ(DIM, CODES, LEVELS, ema=False, dead_threshold=1, process_group=group)
    with torch.no_grad():  # same starting codebook on every rank, far from the data
        far = torch.randn(LEVELS, CODES, DIM, generator=torch.Generator().manual_seed(3)) + 9
        learned.codebook.copy_(far)
    restarted = [learned(_module_data()[mine]).restarted for _ in range(2)]
    used = ("codebook", "cluster_size", "steps_since_active")  # embed_sum is the EMA path's
    out["learned"] = [{k: learned.state_dict()[k] for k in used}, restarted]
    assert any(bool(r.any()) for r in restarted)
    return out, outputs


def _flatten(value, prefix=""):
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _flatten(v, f"{prefix}/{k}")
    else:
        for i, v in enumerate(value):
            yield from _flatten(v, f"{prefix}/{i}")


@pytest.mark.timeout(300)
def test_ranks_agree_and_match_one_process():
    results, outputs = zip(*run_ranks(_worker, WORLD, timeout=240))
    for other in results[1:]:
        for (name, a), (_, b) in zip(_flatten(results[0]), _flatten(other)):
            assert torch.equal(a, b), f"ranks differ at {name}"
    # one process on the concatenated batch (same candidates: rank 0's shard comes first)
    x, codes, _, _ = _data()
    for backend in BACKENDS:
        want = _updates(x, codes, None, backend)
        for (name, a), (_, b) in zip(_flatten(results[0][f"op {backend}"]), _flatten(want)):
            if a.is_floating_point():
                torch.testing.assert_close(a, b, msg=f"{backend}{name}")
            else:
                assert torch.equal(a, b), f"{backend}{name}"
    state, outs = _modules(_module_data(), None, None)
    for name, value in state.items():
        torch.testing.assert_close(results[0]["module"][name], value, msg=name)
    # codes of the second step (after an all-reduced update) are those of the whole batch
    assert torch.equal(torch.cat([o[1][0] for o in outputs]), outs[1][0])
