"""CUDA-only checks: compiled kernels at realistic sizes, bf16/fp16 inputs, determinism with
contended atomics, torch.compile with Inductor, and CUDA-graph capture (of an update, and of a
whole ResidualVQ training step)."""

from __future__ import annotations

import copy

import pytest
import torch
from vq_test_helpers import assert_state_matches, make_state, reference_step

from triton_dispatch import CapturedStep
from triton_dispatch.testing import assert_close, randint, randn
from vq_kernels import DEFAULT_THRESHOLDS, ResidualVQ, ema_update_, quantize, residual_quantize
from vq_kernels.ops.quantize.reference import distances_reference

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("semantics", ["active_only", "decay_all"])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize(
    "shape",
    [(65536, 256, 64, 1), (5000, 1000, 130, 3), (3, 4096, 2000, 1), (4096, 1024, 64, 1),
     (640, 256, 64, 3)],
)  # fmt: skip
def test_ema_update_matches_reference_on_cuda(shape, semantics, deterministic, dtype, rng):
    batch, num_codes, dim, levels = shape
    x = randn((levels, batch, dim), generator=rng).to(dtype)
    codes = randint(0, max(num_codes // 2, 1), (levels, batch), generator=rng)
    state = make_state(levels, num_codes, dim, rng=rng, semantics=semantics)
    candidates = randint(0, batch, (levels, num_codes), generator=rng)
    cuda = [t.cuda() for t in state]
    replaced = ema_update_(
        x.cuda(),
        codes.cuda(),
        *cuda,
        candidates=candidates.cuda(),
        decay=0.9,
        semantics=semantics,
        deterministic=deterministic,
    )
    ref, ref_replaced = reference_step(
        x.float(),
        codes,
        state,
        candidates,
        decay=0.9,
        semantics=semantics,
        threshold=DEFAULT_THRESHOLDS[semantics],
    )
    assert_state_matches([t.cpu() for t in cuda], ref, replaced.cpu(), ref_replaced, tol=1e-5)


@pytest.mark.parametrize("small_max_work", [0, 1 << 40], ids=["cooperative", "small-batch"])
@pytest.mark.parametrize("shape", [(640, 256, 64, 1), (4096, 1024, 64, 2), (5000, 300, 130, 1)])
def test_repeated_updates_through_the_launch_plan(shape, small_max_work, rng, monkeypatch):
    """Later calls of one shape replay a bound launch (the first compiles): four steps in a row,
    each against the float64 reference, on both single-launch designs."""
    from triton_dispatch.launch import clear_plan_caches
    from vq_kernels.ops.ema_update import kernels

    monkeypatch.setattr(kernels, "SMALL_UPDATE_MAX_WORK", small_max_work)
    clear_plan_caches()
    batch, num_codes, dim, levels = shape
    cuda = [t.cuda() for t in make_state(levels, num_codes, dim, rng=rng)]
    for _ in range(4):
        state = [t.cpu() for t in cuda]
        x = randn((levels, batch, dim), generator=rng)
        codes = randint(0, num_codes, (levels, batch), generator=rng)
        candidates = randint(0, batch, (levels, num_codes), generator=rng)
        replaced = ema_update_(x.cuda(), codes.cuda(), *cuda, candidates=candidates.cuda())
        ref, ref_replaced = reference_step(
            x, codes, state, candidates, decay=0.99, semantics="active_only",
            threshold=DEFAULT_THRESHOLDS["active_only"],
        )  # fmt: skip
        assert_state_matches([t.cpu() for t in cuda], ref, replaced.cpu(), ref_replaced, tol=1e-5)
    clear_plan_caches()


def test_deterministic_mode_is_bitwise_equal_under_contention(rng):
    x = randn((65536, 64), generator=rng).cuda()
    codes = randint(0, 8, (65536,), generator=rng).cuda()  # 8 hot codes: heavy contention
    state = [t[0].cuda() for t in make_state(1, 256, 64, rng=rng)]
    runs = []
    for _ in range(3):
        st = [t.clone() for t in state]
        ema_update_(
            x,
            codes,
            *st,
            candidates=torch.zeros(256, dtype=torch.long, device="cuda"),
            deterministic=True,
        )
        runs.append(st)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("metric", ["l2", "cosine"])
@pytest.mark.parametrize(
    "shape", [(4096, 4096, 128), (100, 16384, 64), (65536, 256, 64), (777, 1000, 65)]
)
def test_quantize_on_cuda(shape, metric, dtype, rng):
    batch, num_codes, dim = shape
    x = randn((batch, dim), generator=rng).to(dtype).cuda()
    codebook = randn((num_codes, dim), generator=rng).cuda()
    codes, q = quantize(x, codebook, metric=metric)
    cb = codebook.to(dtype)
    d = distances_reference(x.double(), cb.double(), metric)
    chosen = d.gather(1, codes[:, None])[:, 0]
    best = d.min(1).values
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert ((chosen - best) <= tol * (1 + best.abs())).all()
    assert torch.equal(q, codebook[codes])


def test_quantize_ties_and_separated_inputs_exact_on_cuda(rng):
    codebook = randn((5000, 32), generator=rng, scale=10.0).cuda()
    codebook[[7, 300, 4097]] = codebook[5].clone()
    picks = randint(0, 5000, (3000,), generator=rng).cuda()
    picks[:10] = 5
    x = codebook[picks] + randn((3000, 32), generator=rng, scale=1e-3).cuda()
    x[:10] = codebook[5]
    codes, _ = quantize(x, codebook)
    want = torch.where(picks == 7, 5, picks)
    want = torch.where((want == 300) | (want == 4097), 5, want)
    assert torch.equal(codes, want)


def test_inductor_compiled_training_step_matches_eager(rng):
    torch.manual_seed(0)
    eager = ResidualVQ(64, 256, 3, dead_threshold=None).cuda()
    compiled_module = copy.deepcopy(eager)
    compiled = torch.compile(compiled_module, fullgraph=True)
    x = randn((640, 64), generator=rng).cuda()
    for _ in range(3):
        a, b = eager(x), compiled(x)
        assert torch.equal(a.codes, b.codes)
        torch.testing.assert_close(a.quantized, b.quantized)
    for name in ("codebook", "cluster_size", "embed_sum", "steps_since_active"):
        torch.testing.assert_close(getattr(eager, name), getattr(compiled_module, name))


def test_cuda_graph_capture_of_a_training_update(rng):
    x = randn((4096, 64), generator=rng).cuda()
    state = [t[0].cuda() for t in make_state(1, 256, 64, rng=rng)]
    reference = [t.clone() for t in state]
    codes, _ = quantize(x, state[0])
    # warm up (autotune) outside the capture
    warm = [t.clone() for t in state]
    ema_update_(x, codes, *warm, check_codes=False, dead_threshold=None)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            c, _ = quantize(x, state[0])
            ema_update_(x, c, *state, check_codes=False, dead_threshold=None)
    torch.cuda.current_stream().wait_stream(side)
    graph.replay()
    torch.cuda.synchronize()
    ema_update_(x, codes, *reference, dead_threshold=None)
    for a, b in zip(state, reference):
        torch.testing.assert_close(a, b)


# ---- residual_quantize and the whole-step capture ---------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("metric", ["l2", "cosine"])
@pytest.mark.parametrize(
    "shape",
    # (N, L, K, D): the benchmark's step; a large batch with wide rows; a small batch with a large
    # codebook (the per-level search with K splits); one level with D above the register cap of
    # a row-in-registers design
    [(640, 3, 256, 64), (5000, 2, 1000, 130), (100, 4, 4096, 64), (33, 1, 7, 300)],
)
def test_residual_quantize_on_cuda(shape, metric, dtype, rng):
    batch, levels, num_codes, dim = shape
    x = randn((batch, dim), generator=rng).to(dtype).cuda().requires_grad_()
    codebooks = randn((levels, num_codes, dim), generator=rng).cuda()
    out = residual_quantize(x, codebooks, metric=metric, commitment_weight=0.25)
    cb = codebooks.to(dtype)
    residual = x.detach()
    total = torch.zeros_like(residual)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for level in range(levels):
        # the residual each level saw is the per-level PyTorch loop's, to the bit (x's dtype)
        assert torch.equal(out.inputs[level], residual), level
        d = distances_reference(residual.double(), cb[level].double(), metric)
        chosen = d.gather(1, out.codes[:, level : level + 1])[:, 0]
        best = d.min(1).values
        assert ((chosen - best) <= tol * (1 + best.abs())).all(), level
        q = cb[level][out.codes[:, level]]
        residual = residual - q
        total = total + q
    assert torch.equal(out.level_codes, out.codes.T)
    assert torch.equal(out.quantized, x.detach() + (total - x.detach()))
    after = torch.cat([out.inputs[1:], residual[None]])  # r_1 .. r_L
    want_loss = 0.25 * after.float().square().sum() / x.numel()
    assert_close(out.loss, want_loss, dtype=torch.float32, tol=1e-4, name="loss")
    upstream = randn((batch, dim), generator=rng).to(dtype).cuda()
    (grad,) = torch.autograd.grad(
        [out.quantized, out.loss], [x], [upstream, torch.tensor(3.0).cuda()]
    )
    want = upstream.float() + (3.0 * 2 * 0.25 / x.numel()) * after.float().sum(0)
    assert_close(grad, want.to(dtype), dtype=dtype, name="grad of x")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("metric", ["l2", "cosine"])
@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("shape", [(640, 3, 256, 64), (1000, 2, 1000, 130)])
def test_the_first_calls_stand_in_gives_the_tuned_kernels_results(shape, tf32, metric, dtype,
                                                                  rng, monkeypatch):  # fmt: skip
    """The residual search's first calls run a quicker-compiling config while the tuned one
    compiles: every output is bitwise the tuned config's, near-ties (repeated codes, rows on
    codes) included."""
    from vq_kernels.ops.residual_quantize.kernels import ResidualQuantizePlan

    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
    batch, levels, num_codes, dim = shape
    codebooks = randn((levels, num_codes, dim), generator=rng).to(dtype).cuda()
    codebooks[:, 1::7] = codebooks[:, ::7][:, : codebooks[:, 1::7].shape[1]]  # repeated codes
    x = randn((batch, dim), generator=rng).to(dtype).cuda()
    x[::5] = codebooks[0, randint(0, num_codes, (len(x[::5]),), generator=rng).cuda()]
    norms = codebooks.float().norm(dim=-1)
    plan = ResidualQuantizePlan(batch, num_codes, dim, levels, dtype, x.device, metric, 0.25)
    assert plan.launch.stand_in is not None
    results = []
    for launch in (plan.launch.stand_in, plan.launch):
        outs = [torch.full((batch, dim), float("nan"), device="cuda", dtype=dtype),
                torch.full((batch, levels), -1, device="cuda", dtype=torch.int64),
                torch.full((levels, batch), -1, device="cuda", dtype=torch.int64),
                torch.full((levels + 1, batch, dim), float("nan"), device="cuda", dtype=dtype),
                torch.full((plan.programs,), float("nan"), device="cuda")]  # fmt: skip
        launch._through_triton((x, codebooks, norms, *outs), wait_ahead=False)
        results.append(outs)
    for name, a, b in zip(("out", "codes", "level codes", "residuals", "loss partials"), *results):
        assert torch.equal(a, b), name


def test_residual_quantize_separated_inputs_exact_on_cuda(rng):
    """Coarse-to-fine codebooks and inputs built from one code per level: every level's code is
    known, and the fused search, the per-level search and the picks agree exactly."""
    levels, num_codes, dim, batch = 3, 256, 64, 3000
    codebooks = torch.stack(
        [randn((num_codes, dim), generator=rng, scale=s) for s in (100.0, 10.0, 1.0)]
    ).cuda()
    picks = randint(0, num_codes, (batch, levels), generator=rng).cuda()
    x = sum(codebooks[level][picks[:, level]] for level in range(levels))
    x = x + randn((batch, dim), generator=rng, scale=1e-3).cuda()
    out = residual_quantize(x, codebooks)
    assert torch.equal(out.codes, picks)
    residual = x
    for level in range(levels):
        codes, q = quantize(residual, codebooks[level])
        assert torch.equal(codes, picks[:, level])
        residual = residual - q


def test_fused_module_step_equals_the_per_level_path_on_cuda(rng):
    torch.manual_seed(0)
    fused = ResidualVQ(64, 256, 3, dead_threshold=None).cuda()
    levels = copy.deepcopy(fused)
    levels.fused = False
    codebooks = fused.codebook.clone()
    picks = randint(0, 256, (640, 3), generator=rng).cuda()
    scales = torch.tensor([100.0, 10.0, 1.0], device="cuda")[:, None, None]
    with torch.no_grad():  # coarse-to-fine codebooks so that no code is a near tie
        fused.codebook.mul_(scales)
        levels.codebook.mul_(scales)
        codebooks = fused.codebook.clone()
    x = sum(codebooks[level][picks[:, level]] for level in range(3))
    x = (x + randn((640, 64), generator=rng, scale=1e-2).cuda()).requires_grad_()
    a, b = fused(x), levels(x)
    assert torch.equal(a.codes, picks) and torch.equal(b.codes, picks)
    assert torch.equal(a.quantized, b.quantized)
    torch.testing.assert_close(a.loss, b.loss)
    ga = torch.autograd.grad(a.quantized.square().mean() + a.loss, x)[0]
    gb = torch.autograd.grad(b.quantized.square().mean() + b.loss, x)[0]
    torch.testing.assert_close(ga, gb)
    for name in ("codebook", "cluster_size", "embed_sum", "steps_since_active"):
        torch.testing.assert_close(getattr(fused, name), getattr(levels, name))


def test_captured_training_step_replays_the_eager_steps(rng):
    """Forward, loss, backward and EMA update (restarts on) captured with CapturedStep: every
    replay equals an eager step of a twin module fed the same batch, with its own generator."""
    state = ("codebook", "cluster_size", "embed_sum", "steps_since_active")

    def make():
        torch.manual_seed(0)
        generator = torch.Generator(device="cuda").manual_seed(7)
        return ResidualVQ(64, 256, 3, dead_threshold=2, generator=generator).cuda(), generator

    graphed, generator = make()
    eager, _ = make()
    # batches crowded around a few points: most codes go unused and are restarted
    batches = [randn((640, 64), generator=rng, scale=0.3).cuda() + 2.0 * (i % 2) for i in range(8)]
    static_x = torch.zeros(640, 64, device="cuda", requires_grad=True)
    static_grad = torch.zeros(640, 64, device="cuda")
    outputs = {}

    def step(module, x):
        out = module(x)
        loss = out.quantized.square().mean() + out.loss
        (grad,) = torch.autograd.grad(loss, x)
        return out, loss, grad

    def captured_body():
        out, loss, grad = step(graphed, static_x)
        static_grad.copy_(grad)
        outputs.update(codes=out.codes, quantized=out.quantized, restarted=out.restarted)
        return loss.detach()

    captured = CapturedStep(captured_body, warmup=2, generators=[generator])
    restarts = 0
    for i, batch in enumerate(batches):
        with torch.no_grad():
            static_x.copy_(batch)
        loss = captured()
        out, want_loss, want_grad = step(eager, batch.clone().requires_grad_())
        torch.cuda.synchronize()
        assert torch.equal(outputs["codes"], out.codes), i
        assert torch.equal(outputs["restarted"], out.restarted), i
        torch.testing.assert_close(outputs["quantized"], out.quantized)
        torch.testing.assert_close(loss, want_loss.detach())
        torch.testing.assert_close(static_grad, want_grad)
        for name in state:
            torch.testing.assert_close(getattr(graphed, name), getattr(eager, name), msg=name)
        restarts += int(out.restarted.sum())
    assert captured.captured
    assert restarts > 0  # the replayed steps drew restart rows from the registered generator
