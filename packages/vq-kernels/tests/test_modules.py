"""VectorQuantizer and ResidualVQ: outputs, gradients, EMA state, k-means init, state_dict,
torch.compile (process groups: test_distributed.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from triton_dispatch.testing import randn
from vq_kernels import ResidualVQ, VectorQuantizer, perplexity, quantize


def test_residual_levels_reconstruct_from_codes(rng):
    torch.manual_seed(0)
    m = ResidualVQ(10, 12, 3)
    x = randn((2, 9, 10), generator=rng)
    codebook = m.codebook.clone()
    out = m(x)
    assert out.codes.shape == (2, 9, 3) and out.quantized.shape == x.shape
    assert out.restarted.shape == (3, 12)
    rebuilt = sum(codebook[level][out.codes[..., level]] for level in range(3))
    torch.testing.assert_close(out.quantized, rebuilt)
    # level l's code is the nearest to the residual left by the levels before it
    residual = x.reshape(-1, 10)
    for level in range(3):
        codes, q = quantize(residual, codebook[level])
        assert torch.equal(codes, out.codes.reshape(-1, 3)[:, level])
        residual = residual - q


def test_straight_through_gradient_and_commitment(rng):
    m = VectorQuantizer(6, 8, commitment_weight=0.0)
    x = randn((7, 6), generator=rng, requires_grad=True)
    out = m(x)
    out.quantized.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x))
    m2 = VectorQuantizer(6, 8, commitment_weight=0.5).eval()
    out = m2(x)
    want = 0.5 * torch.mean((x - m2.codebook[0][out.codes]) ** 2)
    torch.testing.assert_close(out.loss, want)


def test_eval_mode_leaves_the_state_alone(rng):
    m = ResidualVQ(4, 6, 2).eval()
    before = copy.deepcopy(m.state_dict())
    out = m(randn((11, 4), generator=rng))
    assert out.restarted is None
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_training_step_matches_the_op(rng):
    from vq_kernels import ema_update_

    m = VectorQuantizer(5, 7, decay=0.8, dead_threshold=None)
    manual = copy.deepcopy(m)
    x = randn((13, 5), generator=rng)
    out = m(x)
    codes, _ = quantize(x, manual.codebook[0])
    ema_update_(
        x,
        codes,
        manual.codebook[0],
        manual.cluster_size[0],
        manual.embed_sum[0],
        manual.steps_since_active[0],
        decay=0.8,
        dead_threshold=None,
    )
    assert torch.equal(out.codes, codes)
    for name in ("codebook", "cluster_size", "embed_sum", "steps_since_active"):
        torch.testing.assert_close(getattr(m, name), getattr(manual, name))


def test_learned_codebook_gets_gradients_and_no_ema(rng):
    m = ResidualVQ(4, 6, 2, ema=False, dead_threshold=None)
    assert isinstance(m.codebook, torch.nn.Parameter)
    size, book = m.cluster_size.clone(), m.codebook.detach().clone()
    out = m(randn((9, 4), generator=rng, requires_grad=True))
    out.loss.backward()
    assert out.restarted is None
    assert m.codebook.grad is not None and m.codebook.grad.abs().sum() > 0
    assert torch.equal(m.cluster_size, size) and torch.equal(m.codebook.detach(), book)


@pytest.mark.parametrize("semantics", ["active_only", "decay_all"])
def test_a_learned_codebook_restarts_its_dead_codes(semantics, rng):
    """``dead_threshold`` acts with ``ema=False`` too: trained by its loss alone on data far from
    the initial codes, a residual VQ uses a few of its codes; with restarts its dead codes take
    rows of the residuals and the first level uses most of them."""
    centers = randn((16, 8), generator=rng, scale=4.0) + 30.0
    x = centers[torch.arange(256) % 16] + randn((256, 8), generator=rng, scale=0.2)

    def used_codes(threshold):
        torch.manual_seed(0)
        m = ResidualVQ(8, 16, 2, ema=False, semantics=semantics, dead_threshold=threshold,
                       decay=0.5, backend="torch")  # fmt: skip
        opt = torch.optim.Adam(m.parameters(), lr=0.05)
        restarted = 0
        for _ in range(12):
            out = m(x)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
            restarted += 0 if out.restarted is None else int(out.restarted.sum())
        m.eval()
        codes = m(x).codes
        return [len(torch.unique(codes[:, level])) for level in range(2)], restarted

    collapsed, none = used_codes(None)
    restarting, restarted = used_codes(1.0 if semantics == "decay_all" else 2)
    assert none == 0 and restarted > 0
    assert restarting[0] >= 12 and restarting[0] >= collapsed[0] + 6, (collapsed, restarting)


def test_learned_restarts_leave_an_empty_batch_alone():
    m = ResidualVQ(4, 6, 2, ema=False, dead_threshold=1)
    book = m.codebook.detach().clone()
    for _ in range(3):
        out = m(torch.zeros(0, 4))
    assert not out.restarted.any() and torch.equal(m.codebook.detach(), book)


def test_kmeans_init_on_first_batch_and_state_dict_round_trip(rng):
    centers = randn((4, 3), generator=rng, scale=10.0)
    x = centers[torch.arange(64) % 4] + randn((64, 3), generator=rng, scale=0.1)
    torch.manual_seed(0)
    m = VectorQuantizer(3, 4, kmeans_init=True, kmeans_iters=5, dead_threshold=None)
    assert not bool(m.initialized)
    out = m(x)
    assert bool(m.initialized)
    torch.manual_seed(0)
    plain = VectorQuantizer(3, 4, dead_threshold=None)
    # k-means may merge two clusters, but it lands far closer than a random N(0, 1) codebook
    assert out.loss.item() < 0.3 * plain(x).loss.item()
    fresh = VectorQuantizer(3, 4, kmeans_init=True)
    fresh.load_state_dict(m.state_dict())
    assert fresh._initialized
    m.eval(), fresh.eval()
    a, b = m(x), fresh(x)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.quantized, b.quantized)


def test_dead_codes_restart_in_training(rng):
    m = VectorQuantizer(4, 16, dead_threshold=2)
    x = randn((8, 4), generator=rng) + 50.0  # far from every code: few codes win
    restarted = [m(x).restarted for _ in range(3)]
    assert sum(int(r.sum()) for r in restarted) > 0
    assert torch.isfinite(m.codebook).all()


def test_perplexity():
    assert perplexity(torch.arange(8), 8).item() == pytest.approx(8.0)
    assert perplexity(torch.zeros(5, dtype=torch.long), 8).item() == pytest.approx(1.0)


def test_bad_module_arguments():
    with pytest.raises(ValueError, match="semantics"):
        ResidualVQ(4, 4, semantics="x")
    with pytest.raises(ValueError, match="metric"):
        ResidualVQ(4, 4, metric="dot")
    with pytest.raises(ValueError, match="dead_threshold"):
        ResidualVQ(4, 4, dead_threshold=0)
    with pytest.raises(ValueError, match=r"\(\.\.\., 4\)"):
        ResidualVQ(4, 4)(torch.zeros(3, 5))


@pytest.mark.parametrize("backend", ["torch", None])
def test_torch_compile_fullgraph_matches_eager(backend, rng):
    torch.manual_seed(0)
    eager = ResidualVQ(6, 8, 2, dead_threshold=None, backend=backend)
    compiled_module = copy.deepcopy(eager)
    compiled = torch.compile(compiled_module, fullgraph=True, backend="aot_eager")
    x = randn((10, 6), generator=rng)
    for _ in range(2):
        a, b = eager(x), compiled(x)
        assert torch.equal(a.codes, b.codes)
        torch.testing.assert_close(a.loss, b.loss)
    for name in ("codebook", "cluster_size", "embed_sum", "steps_since_active"):
        torch.testing.assert_close(getattr(eager, name), getattr(compiled_module, name))


def test_empty_batch_is_a_no_op_with_zero_loss():
    m = ResidualVQ(4, 6, 2)
    before = copy.deepcopy(m.state_dict())
    out = m(torch.empty(0, 4))
    assert out.codes.shape == (0, 2) and out.loss.item() == 0.0
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_cosine_metric_module(rng):
    m = VectorQuantizer(5, 9, metric="cosine")
    x = randn((12, 5), generator=rng)
    codebook = m.codebook[0].clone()
    out = m(x)
    want, _ = quantize(x, codebook, metric="cosine")
    assert torch.equal(out.codes, want)
