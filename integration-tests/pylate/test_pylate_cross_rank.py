"""PyLate's contrastive losses with ``gather_across_devices=True`` in a real process group (gloo,
two ranks, interpreted kernels): patched, they score through ``maxsim_across_ranks`` and give
the loss and the gradients of PyLate's own ``all_gather_with_gradients`` route on every rank."""

from __future__ import annotations

import pytest
import torch

from triton_dispatch.testing import run_ranks

pytest.importorskip("pylate", reason="needs the 'pylate' extra of late-interaction-kernels")

DIM = 16
VOCAB = 20


class TinyEncoder(torch.nn.Module):
    """Stands in for a ColBERT model: token embeddings from an embedding table."""

    skiplist: list[int] = [7]  # noqa: RUF012
    do_query_expansion = False

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)  # the same weights on every rank
        self.table = torch.nn.Parameter(torch.randn(VOCAB, DIM, generator=g))

    def forward(self, features):
        return {"token_embeddings": self.table[features["input_ids"]]}


def _features(g, batch, length):
    ids = torch.randint(1, VOCAB, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(batch):
        mask[row, torch.randint(1, length + 1, (1,), generator=g).item() :] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _loss_and_grad(loss, model, feats):
    model.zero_grad(set_to_none=True)
    value = loss(feats)
    value.backward()  # CachedContrastive feeds its cached gradients in a hook of this backward
    return value.detach(), model.table.grad.clone()


def _worker(rank, world_size):
    from pylate.losses import CachedContrastive, Contrastive

    import late_interaction_kernels as lik
    from late_interaction_kernels import patch_pylate, unpatch_pylate

    calls = {"n": 0}
    original = lik.maxsim_across_ranks

    def counted(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    lik.maxsim_across_ranks = counted
    g = torch.Generator().manual_seed(1 + rank)
    feats = [_features(g, 3, 4), _features(g, 3, 6), _features(g, 3, 6)]  # query, pos, hard neg
    model = TinyEncoder()
    makers = {
        "Contrastive": lambda: Contrastive(model, gather_across_devices=True, temperature=0.5),
        "CachedContrastive": lambda: CachedContrastive(
            model, mini_batch_size=2, gather_across_devices=True
        ),
    }
    out = {}
    for name, make in makers.items():
        want = _loss_and_grad(make(), model, feats)
        assert patch_pylate()
        before = calls["n"]
        got = _loss_and_grad(make(), model, feats)
        routed = calls["n"] - before
        unpatch_pylate()
        restored = _loss_and_grad(make(), model, feats)
        out[name] = {"want": want, "got": got, "routed": routed, "restored": restored}
    return out


def test_gathering_losses_route_across_ranks_with_pylates_gradients():
    routed = {"LATE_INTERACTION_KERNELS_CROSS_RANK": "1"}  # the route is opt-in
    for rank, out in enumerate(run_ranks(_worker, 2, env=routed)):
        for name, r in out.items():
            assert r["routed"] == 1, (rank, name, r["routed"])
            for got in (r["got"], r["restored"]):
                torch.testing.assert_close(got[0], r["want"][0], rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(got[1], r["want"][1], rtol=1e-4, atol=1e-6)
