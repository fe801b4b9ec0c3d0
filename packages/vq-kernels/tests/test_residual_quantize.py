"""residual_quantize: the one-launch residual search (interpreter on CPU) against the per-level
path and the float64 reference, its gradients, degenerate sizes, bad inputs, plan reuse, and
ResidualVQ on the fused path against the per-level path."""

from __future__ import annotations

import copy

import pytest
import torch

from triton_dispatch.testing import (
    OpSpec,
    TensorArg,
    assert_close,
    assert_gradients_match,
    bad_input_params,
    check_bad_input,
    poison_,
    randn,
)
from vq_kernels import ResidualVQ, VectorQuantizer, quantize, residual_quantize
from vq_kernels.ops.quantize.reference import distances_reference
from vq_kernels.ops.residual_quantize.op import RESIDUAL_QUANTIZE
from vq_kernels.ops.residual_quantize.reference import (
    residual_loss_reference,
    residual_quantize_reference,
    residual_vq_reference,
)

_PLANS = RESIDUAL_QUANTIZE._plans

METRICS = ("l2", "cosine")
# (N, L, K, D): several row programs and code tiles (interpreter tiles are 16 wide), D over several
# chunks, one row, one level, and a K below one tile.
SHAPES = [(37, 3, 45, 20), (1, 1, 3, 5), (20, 2, 40, 70), (50, 4, 9, 16)]


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every buffer the op allocates starts as NaN / int-min, so an element a kernel skips fails."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def poisoned(t):
        return t if t.dtype == torch.bool else poison_(t)

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poisoned(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poisoned(real_empty_like(*a, **k)))


def _per_level(x, codebooks, metric):
    """The module's per-level path: one ``quantize`` call per level, in x's dtype."""
    return residual_quantize_reference(
        x,
        codebooks,
        metric,
        search=lambda r, level: quantize(r, codebooks[level], metric=metric)[0],
    )


def _float64_outputs(x, codebooks, codes):
    """Residuals and straight-through value in float64 for the given codes."""
    residual = x.double()
    total = torch.zeros_like(residual)
    residuals = [residual]
    for level in range(codebooks.shape[0]):
        q = codebooks[level].to(x.dtype).double()[codes[:, level]]
        residual = residual - q
        total = total + q
        residuals.append(residual)
    return torch.stack(residuals), total


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_the_per_level_path_and_float64(shape, metric, rng, device, poisoned_outputs):
    batch, levels, num_codes, dim = shape
    x = randn((batch, dim), generator=rng, device=device)
    codebooks = randn((levels, num_codes, dim), generator=rng, device=device)
    out = residual_quantize(x, codebooks, metric=metric, commitment_weight=0.25)
    assert out.codes.shape == (batch, levels) and out.codes.dtype == torch.int64
    assert out.inputs.shape == (levels, batch, dim) and out.level_codes.shape == (levels, batch)
    assert torch.equal(out.level_codes, out.codes.T)
    # the same search arithmetic as quantize, level after level: the per-level path to the bit
    quantized, codes, residuals = _per_level(x, codebooks, metric)
    assert torch.equal(out.codes, codes)
    assert torch.equal(out.inputs, residuals[:levels])
    assert torch.equal(out.quantized, quantized)
    # each level's code is a nearest one (float64) for the residual it saw
    for level in range(levels):
        d = distances_reference(out.inputs[level].double(), codebooks[level].double(), metric)
        chosen = d.gather(1, out.codes[:, level : level + 1])[:, 0]
        best = d.min(1).values
        assert ((chosen - best) <= 1e-5 * (1 + best.abs())).all()
    # values against float64 arithmetic on the same codes
    ref_residuals, ref_total = _float64_outputs(x.cpu(), codebooks.cpu(), out.codes.cpu())
    assert_close(out.inputs, ref_residuals[:levels], name="inputs")
    assert_close(out.quantized, ref_total, name="quantized")
    assert_close(out.loss, residual_loss_reference(ref_residuals, 0.25), name="loss")


def test_float16_rounds_like_the_per_level_path(rng, device, poisoned_outputs):
    x = randn((21, 24), generator=rng, device=device).half()
    codebooks = randn((3, 20, 24), generator=rng, device=device)  # fp32, cast to x's dtype
    out = residual_quantize(x, codebooks)
    quantized, codes, residuals = _per_level(x, codebooks, "l2")
    assert out.quantized.dtype == torch.float16 and out.inputs.dtype == torch.float16
    assert torch.equal(out.codes, codes)
    assert torch.equal(out.inputs, residuals[:3])
    assert torch.equal(out.quantized, quantized)
    assert_close(out.loss, residual_loss_reference(residuals.double()), dtype=torch.float32)


def test_bfloat16_inputs(rng, device, poisoned_outputs):
    """The interpreter rounds fp32 to bf16 by truncation, the GPU (and PyTorch) to nearest even:
    here the residuals agree within bf16 rounding; test_gpu checks them bit for bit."""
    x = randn((21, 24), generator=rng, device=device).bfloat16()
    codebooks = randn((3, 20, 24), generator=rng, device=device)
    out = residual_quantize(x, codebooks)
    codes = _per_level(x, codebooks, "l2")[1]
    assert out.quantized.dtype == torch.bfloat16 and out.inputs.dtype == torch.bfloat16
    assert torch.equal(out.codes[:, 0], codes[:, 0])  # level 0 sees x itself
    cb = codebooks.bfloat16().double()
    for level in range(3):
        d = distances_reference(out.inputs[level].double(), cb[level], "l2")
        chosen = d.gather(1, out.codes[:, level : level + 1])[:, 0]
        best = d.min(1).values
        assert ((chosen - best) <= 1e-5 * (1 + best.abs())).all()
    ref_residuals, ref_total = _float64_outputs(x.cpu(), codebooks.cpu(), out.codes.cpu())
    assert_close(out.inputs, ref_residuals[:3], name="inputs")
    assert_close(out.quantized, ref_total, name="quantized")


@pytest.mark.parametrize("metric", METRICS)
def test_gradients_match_autograd_of_the_reference(metric, rng, device, poisoned_outputs):
    x = randn((19, 18), generator=rng, device=device, requires_grad=True)
    codebooks = randn((3, 21, 18), generator=rng, device=device, requires_grad=True)
    seen = {}

    def op(x, codebooks):
        out = residual_quantize(
            x, codebooks, metric=metric, commitment_weight=0.3, codebook_weight=0.7
        )
        seen["codes"] = out.codes.clone()  # on the inputs' device, which the reference shares
        return out.quantized, out.loss

    def reference(x, codebooks):
        # the op's codes (ties within rounding may go either way); values and gradients in float64
        quantized, _, loss = residual_vq_reference(
            x, codebooks, metric, 0.3, 0.7, search=lambda r, level: seen["codes"][:, level]
        )
        return quantized, loss

    assert_gradients_match(op, reference, [x, codebooks], names=["x", "codebooks"], generator=rng)


def test_gradient_of_each_output_alone(rng, device):
    x = randn((17, 6), generator=rng, device=device, requires_grad=True)
    codebooks = randn((2, 5, 6), generator=rng, device=device)
    out = residual_quantize(x, codebooks, commitment_weight=0.5)
    (grad,) = torch.autograd.grad(out.quantized.sum(), x)
    assert torch.equal(grad, torch.ones_like(x))  # straight-through: the identity
    out = residual_quantize(x, codebooks, commitment_weight=0.5)
    (grad,) = torch.autograd.grad(out.loss, x)
    final = out.inputs[1] - codebooks[1][out.codes[:, 1]]
    want = (2 * 0.5 / x.numel()) * (out.inputs[1] + final)
    torch.testing.assert_close(grad, want)


def test_no_autograd_graph_without_grad(rng, device):
    x = randn((9, 4), generator=rng, device=device)
    codebooks = randn((2, 5, 4), generator=rng, device=device, requires_grad=True)
    with torch.no_grad():
        out = residual_quantize(x, codebooks, codebook_weight=1.0)
    assert not out.loss.requires_grad and not out.quantized.requires_grad
    out = residual_quantize(x, codebooks.detach())
    assert out.loss.grad_fn is None


def test_empty_batch(rng, device):
    codebooks = randn((3, 5, 4), generator=rng, device=device)
    x = torch.empty(0, 4, device=device, requires_grad=True)
    out = residual_quantize(x, codebooks)
    assert out.quantized.shape == (0, 4) and out.codes.shape == (0, 3)
    assert out.inputs.shape == (3, 0, 4) and out.level_codes.shape == (3, 0)
    assert out.loss.item() == 0.0
    (out.quantized.sum() + out.loss).backward()
    assert x.grad.shape == (0, 4)
    out = residual_quantize(torch.empty(2, 0, 4, device=device), codebooks)
    assert out.quantized.shape == (2, 0, 4) and out.codes.shape == (2, 0, 3)


def test_one_code_and_leading_dims(rng, device, poisoned_outputs):
    x = randn((2, 3, 5), generator=rng, device=device)
    codebooks = randn((2, 1, 5), generator=rng, device=device)
    out = residual_quantize(x, codebooks)
    assert out.codes.shape == (2, 3, 2) and bool((out.codes == 0).all())
    torch.testing.assert_close(out.quantized, codebooks[:, 0].sum(0).expand(2, 3, 5))
    assert out.inputs.shape == (2, 6, 5)
    one = residual_quantize(x[0, 0], codebooks)  # a single vector (D,)
    assert one.codes.shape == (2,) and one.quantized.shape == (5,)


def test_ties_go_to_the_lowest_index_and_nan_rows_to_code_zero(rng, device, poisoned_outputs):
    codebooks = randn((2, 40, 8), generator=rng)
    codebooks[0] *= 10  # level 0 coarse, level 1 fine: c0[3] + c1[2] lies nearest c0[3]
    # duplicates inside one 16-wide tile and across tiles
    codebooks[0, [5, 9, 20, 35]] = codebooks[0, 3].clone()
    codebooks[1, [17, 33]] = codebooks[1, 2].clone()
    x = torch.cat(
        [codebooks[0, [3]], codebooks[0, [3]] + codebooks[1, [2]], randn((3, 8), generator=rng)]
    )
    x[-1, 4] = float("nan")
    out = residual_quantize(x.to(device), codebooks.to(device))
    codes = out.codes.cpu()
    assert codes[0, 0] == 3 and codes[1].tolist() == [3, 2]
    assert codes[-1].tolist() == [0, 0]
    # level 1 of row 0 sees a zero residual: every distance is ‖c‖², ties to the lowest index
    norms = torch.linalg.vector_norm(codebooks[1], dim=-1)
    assert codes[0, 1] == int(torch.argmin(norms * norms))  # ‖c‖² as the kernel forms it
    assert torch.equal(out.codes, _per_level(x.to(device), codebooks.to(device), "l2")[1])
    assert torch.isfinite(out.quantized[:-1]).all() and torch.isnan(out.quantized[-1]).any()


def _quantized_and_codes(x, codebooks, **kw):
    """The comparable part of the result: codes and straight-through value, as the op shapes them."""
    out = residual_quantize(x, codebooks, **kw)
    return out.codes, out.quantized


def _reference_for_kit(x, codebooks, **kw):
    flat = x.reshape(-1, x.shape[-1])
    quantized, codes, _ = residual_quantize_reference(flat, codebooks)
    return codes.view(*x.shape[:-1], codebooks.shape[0]), quantized.view(x.shape)


FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
RESIDUAL_QUANTIZE = OpSpec(
    "residual_quantize",
    _quantized_and_codes,
    _reference_for_kit,
    lambda g: {"x": randn((6, 3), generator=g), "codebooks": randn((2, 4, 3), generator=g)},
    [TensorArg("x", ranks=(1, 2, 3), dtypes=FLOATS), TensorArg("codebooks", dtypes=FLOATS)],
    tol=1e-5,
)


@pytest.mark.parametrize("case", bad_input_params(RESIDUAL_QUANTIZE))
def test_bad_inputs(case, seed, device):
    check_bad_input(case, seed=seed, device=device)


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        ({"metric": "dot"}, ValueError, "metric"),
        ({"commitment_weight": "1"}, TypeError, "commitment_weight"),
        ({"commitment_weight": True}, TypeError, "commitment_weight"),
        ({"codebook_weight": float("nan")}, ValueError, "codebook_weight"),
        ({"backend": "cuda"}, ValueError, "backend"),
    ],
)
def test_bad_settings_are_named(kwargs, error, name, rng):
    x, codebooks = randn((4, 3), generator=rng), randn((2, 5, 3), generator=rng)
    with pytest.raises(error, match=name):
        residual_quantize(x, codebooks, **kwargs)


def test_bad_shapes_are_named(rng):
    x = randn((4, 3), generator=rng)
    with pytest.raises(ValueError, match="codebooks"):
        residual_quantize(x, randn((5, 3), generator=rng))
    with pytest.raises(ValueError, match="codebooks"):
        residual_quantize(x, torch.empty(2, 0, 3))
    with pytest.raises(ValueError, match="D"):
        residual_quantize(x, randn((2, 5, 4), generator=rng))
    with pytest.raises(TypeError, match="codebooks"):
        residual_quantize(x, [[[1.0, 2.0, 3.0]]])


def test_plans_follow_metadata(rng, monkeypatch):
    _PLANS.clear()
    x, cb = randn((6, 8), generator=rng), randn((2, 5, 8), generator=rng)
    wide = randn((6, 16), generator=rng)
    variants = [
        ("first", x, cb, {}, False),
        ("same metadata", randn((6, 8), generator=rng), cb * 3, {}, True),
        ("x requires grad", x.clone().requires_grad_(), cb, {}, False),
        ("non-contiguous x", wide[:, ::2], cb, {}, False),
        # the key holds contiguity, not strides: the non-contiguous plan serves a stride-0 view too
        ("expanded x", x[:1].expand(6, -1), cb, {}, True),
        ("float16", x.half(), cb, {}, False),
        ("three levels", x, torch.cat([cb, cb[:1]]), {}, False),
        ("another weight", x, cb, {"commitment_weight": 0.5}, False),
        ("cosine", x, cb, {"metric": "cosine"}, False),
        ("first again", x, cb, {}, True),
    ]
    for label, xi, cbi, kw, hit in variants:
        before = (_PLANS.hits, _PLANS.misses)
        out = residual_quantize(xi, cbi, **kw)
        delta = (_PLANS.hits - before[0], _PLANS.misses - before[1])
        assert delta == ((1, 0) if hit else (0, 1)), (label, delta)
        want = _per_level(xi, cbi, kw.get("metric", "l2"))
        assert torch.equal(out.codes, want[1]), label
        assert torch.equal(out.quantized, want[0]), label
        monkeypatch.setenv("TRITON_DISPATCH_PLAN_CACHE", "0")
        again = residual_quantize(xi, cbi, **kw)
        monkeypatch.delenv("TRITON_DISPATCH_PLAN_CACHE")
        assert torch.equal(out.codes, again.codes), label
        assert torch.equal(out.loss, again.loss), label


def test_large_codebooks_search_level_by_level(rng, device, monkeypatch, poisoned_outputs):
    """Where the one-program-per-row-tile kernel would walk too many codes (a small batch, a large
    codebook: ``fused_fits`` is False), the op runs the one-level search per level: same results."""
    from vq_kernels.ops.residual_quantize import kernels

    monkeypatch.setattr(kernels, "fused_fits", lambda *args: False)
    _PLANS.clear()
    x = randn((13, 10), generator=rng, device=device, requires_grad=True)
    codebooks = randn((2, 30, 10), generator=rng, device=device)
    out = residual_quantize(x, codebooks, commitment_weight=0.25)
    quantized, codes, residuals = _per_level(x.detach(), codebooks, "l2")
    assert torch.equal(out.codes, codes) and torch.equal(out.quantized, quantized)
    assert torch.equal(out.inputs, residuals[:2])
    torch.testing.assert_close(out.loss, residual_loss_reference(residuals, 0.25))
    (grad,) = torch.autograd.grad(out.loss, x)
    torch.testing.assert_close(grad, (2 * 0.25 / x.numel()) * residuals[1:].sum(0))
    _PLANS.clear()


def test_torch_compile_traces_values_and_gradients(rng):
    x = randn((10, 6), generator=rng, requires_grad=True)
    codebooks = randn((2, 7, 6), generator=rng, requires_grad=True)

    def step(x, codebooks):
        out = residual_quantize(x, codebooks, commitment_weight=0.25, codebook_weight=1.0)
        return out.codes, out.quantized.square().mean() + out.loss

    eager_codes, eager_loss = step(x, codebooks)
    eager_grads = torch.autograd.grad(eager_loss, [x, codebooks])
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    codes, loss = compiled(x, codebooks)
    grads = torch.autograd.grad(loss, [x, codebooks])
    assert torch.equal(codes, eager_codes)
    torch.testing.assert_close(loss, eager_loss)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b)


# ---- the module on the fused path -------------------------------------------------------------


def _twins(*args, **kwargs):
    """A module on the fused path and its copy on the per-level path, with equal generators."""
    torch.manual_seed(0)
    fused = ResidualVQ(*args, generator=torch.Generator().manual_seed(5), **kwargs)
    levels = copy.deepcopy(fused)
    levels.fused = False
    levels.generator = torch.Generator().manual_seed(5)
    return fused, levels


def _step(module, x):
    x = x.clone().requires_grad_()
    out = module(x)
    (out.quantized.square().mean() + out.loss).backward()
    return out, x.grad


STATE = ("codebook", "cluster_size", "embed_sum", "steps_since_active")


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"dead_threshold": 1},  # restarts at every step for codes no row chose
        {"metric": "cosine", "commitment_weight": 0.5},
        {"semantics": "decay_all"},
        {"ema": False},
    ],
    ids=["default", "restarts", "cosine", "decay_all", "learned"],
)
def test_module_step_equals_the_per_level_path(kwargs, rng, monkeypatch):
    fused, levels = _twins(6, 12, 3, **kwargs)
    calls = []
    real = ResidualVQ._fused
    monkeypatch.setattr(
        ResidualVQ, "_fused", lambda self, flat: calls.append(1) or real(self, flat)
    )
    for step in range(3):
        x = randn((2, 11, 6), generator=rng)
        a, grad_a = _step(fused, x)
        b, grad_b = _step(levels, x)
        assert torch.equal(a.codes, b.codes)
        if step == 0:  # equal codebooks: equal values
            assert torch.equal(a.quantized, b.quantized)
        # later the EMA updates differ by rounding: the two paths hand it codes in another layout,
        # which picks another of its kernels
        torch.testing.assert_close(a.quantized, b.quantized)
        torch.testing.assert_close(a.loss, b.loss)
        torch.testing.assert_close(grad_a, grad_b)
        if a.restarted is None:
            assert b.restarted is None
        else:
            assert torch.equal(a.restarted, b.restarted)
        for name in STATE:
            torch.testing.assert_close(getattr(fused, name), getattr(levels, name), msg=name)
        if not fused.ema:
            torch.testing.assert_close(fused.codebook.grad, levels.codebook.grad)
    assert len(calls) == 3  # every step took the fused path


def test_vector_quantizer_and_eval_mode_on_the_fused_path(rng):
    torch.manual_seed(0)
    vq = VectorQuantizer(5, 7, dead_threshold=None)
    manual = copy.deepcopy(vq)
    x = randn((13, 5), generator=rng)
    out = vq(x)
    codes, q = quantize(x, manual.codebook[0])
    assert out.codes.shape == (13,) and out.restarted.shape == (7,)
    assert torch.equal(out.codes, codes) and torch.equal(out.quantized, x + (q - x))
    vq.eval()
    before = copy.deepcopy(vq.state_dict())
    assert vq(x).restarted is None
    for k, v in vq.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_kmeans_step_runs_per_level_then_the_fused_path_takes_over(rng, monkeypatch):
    centers = randn((4, 3), generator=rng, scale=10.0)
    x = centers[torch.arange(32) % 4] + randn((32, 3), generator=rng, scale=0.1)
    torch.manual_seed(0)
    m = ResidualVQ(3, 4, 2, kmeans_init=True, kmeans_iters=2, dead_threshold=None)
    paths = []
    real_fused, real_levels = ResidualVQ._fused, ResidualVQ._levels
    monkeypatch.setattr(
        ResidualVQ, "_fused", lambda self, f: paths.append("fused") or real_fused(self, f)
    )
    monkeypatch.setattr(
        ResidualVQ, "_levels", lambda self, f, i: paths.append("levels") or real_levels(self, f, i)
    )
    m(x)
    m(x)
    assert paths == ["levels", "fused"]
