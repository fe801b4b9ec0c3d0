"""The FP8 operand writers (the AdaLN norms and the SwiGLU gate leaving float8 e4m3 rows with a
scale per row) against their references and float64, their shared rounding against PyTorch's
cast, and the row-scaled FP8 GEMM's checks and reference route."""

import pytest
import torch
import triton
import triton.language as tl

from stream_dit.ops.adaln_norm import adaln_rms_norm_fp8, rms_norm_modulate_fp8
from stream_dit.ops.adaln_norm.reference import (
    adaln_rms_norm_fp8_reference,
    adaln_rms_norm_reference,
)
from stream_dit.ops.fp8_linear import (
    E4M3_MAX,
    dequantize_rows,
    fp8_linear,
    fp8_linear_reference,
    quantize_rows,
)
from stream_dit.ops.fp8_linear.kernels import round_to_e4m3
from stream_dit.ops.swiglu import swiglu_fp8, swiglu_fp8_reference, swiglu_reference
from triton_dispatch.testing import assert_close

FP8 = torch.float8_e4m3fn


@triton.jit
def _round_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    v = tl.load(x_ptr + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, round_to_e4m3(v).to(tl.float8e4nv), mask=ok)


def test_e4m3_rounding_is_torchs_cast(rng, device):
    """Ties to even at every binade, the subnormals, the largest value and zero: the codes the
    kernels write are the ones ``Tensor.to(torch.float8_e4m3fn)`` gives."""
    grid = torch.arange(0, 256, dtype=torch.uint8).view(FP8).to(torch.float32)
    grid = grid[torch.isfinite(grid) & (grid.abs() <= E4M3_MAX)]
    grid = grid.sort().values.unique()
    ties = (grid[1:] + grid[:-1]) / 2  # exactly halfway between neighbours
    near = torch.cat([ties * (1 + 2**-20), ties * (1 - 2**-20)])
    spread = (torch.rand(4000, generator=rng) * 2 - 1) * E4M3_MAX * torch.rand(4000, generator=rng) ** 6
    values = torch.cat([grid, ties, near, spread, -ties, -spread]).clamp(-E4M3_MAX, E4M3_MAX)
    values = values.to(device)
    out = torch.empty(values.shape, device=device, dtype=FP8)
    _round_kernel[(triton.cdiv(values.numel(), 1024),)](values, out, values.numel(), BLOCK=1024)
    want = values.to(FP8)
    same = out.view(torch.uint8) == want.view(torch.uint8)
    # +0 and -0 are the same value
    same |= (out.to(torch.float32) == 0) & (want.to(torch.float32) == 0)
    assert bool(same.all()), values[~same][:8].tolist()


def _f64(*tensors):
    return [None if t is None else t.double().cpu() for t in tensors]


def _check_rows(q, scale, exact, *, name):
    """Codes and scales of a float8 output against the float64 rows they stand for."""
    assert q.dtype == FP8 and scale.dtype == torch.float32
    assert tuple(scale.shape) == tuple(q.shape[:-1])
    want_scale = (exact.abs().amax(-1) / E4M3_MAX).clamp_min(1e-12)
    torch.testing.assert_close(scale.double().cpu(), want_scale, rtol=1e-5, atol=0, msg=name)
    got = dequantize_rows(q.cpu(), scale.cpu()).double()
    err = ((got - exact).norm() / exact.norm()).item()
    # e4m3 keeps 3 mantissa bits: each element within 2^-4 of itself, about 2.5 % in L2 on
    # these rows; a wrong scale, rounding or row would be far off
    assert err < 0.035, (name, err)
    per_element = ((got - exact).abs() / exact.abs().clamp_min(scale.double().cpu()[..., None] * 2**-6))
    assert per_element.max().item() <= 2**-4 * 1.001, (name, per_element.max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("gated", [True, False])
def test_adaln_rms_norm_fp8_matches_float64(rng, device, dtype, gated):
    b, n, width = 3, 7, 40
    x, delta = (torch.randn(b, n, width, generator=rng).to(device, dtype) for _ in range(2))
    weight = torch.randn(width, generator=rng).to(device, dtype)
    mod = torch.randn(b, 6, width, generator=rng).to(device, dtype)
    gate = mod[:, 2] if gated else None
    residual, q, scale = adaln_rms_norm_fp8(
        x, weight, delta, gate=gate, scale=mod[:, 1], shift=mod[:, 0]
    )
    ref_residual, _ = adaln_rms_norm_reference(*_f64(x, weight, delta, gate, mod[:, 1], mod[:, 0]))
    assert_close(residual, ref_residual, dtype=dtype, name="residual")
    # the rows the norm sees are the rounded residual's
    from stream_dit.ops.adaln_norm.reference import _residual_and_normed

    _, exact = _residual_and_normed(residual.double().cpu(), *_f64(weight), None, None,
                                    *_f64(mod[:, 1], mod[:, 0]), 1e-6)  # fmt: skip
    _check_rows(q, scale, exact, name="adaln normed")
    # the declared reference gives the same codes (same float32 arithmetic up to rounding)
    _, ref_q, _ = adaln_rms_norm_fp8_reference(x, weight, delta, gate, mod[:, 1], mod[:, 0])
    assert (q.view(torch.uint8) == ref_q.view(torch.uint8)).float().mean().item() > 0.99
    alone_q, alone_scale = rms_norm_modulate_fp8(x, weight, scale=mod[:, 1], shift=mod[:, 0])
    _, exact = _residual_and_normed(*_f64(x, weight), None, None, *_f64(mod[:, 1], mod[:, 0]), 1e-6)
    _check_rows(alone_q, alone_scale, exact, name="rms_norm_modulate")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_swiglu_fp8_matches_float64(rng, device, dtype):
    gate_up = (3 * torch.randn(2, 5, 2 * 36, generator=rng)).to(device, dtype)
    gate_up[0, 1] = 0  # an all-zero row: zeros with the floor scale
    q, scale = swiglu_fp8(gate_up)
    exact = swiglu_reference(gate_up.double().cpu())
    assert float(scale[0, 1]) == pytest.approx(1e-12)
    assert not q[0, 1].to(torch.float32).any()
    keep = torch.ones(2, 5, dtype=torch.bool)
    keep[0, 1] = False
    _check_rows(q[keep], scale[keep], exact[keep], name="swiglu")
    ref_q, _ = swiglu_fp8_reference(gate_up)
    assert (q.view(torch.uint8) == ref_q.view(torch.uint8)).float().mean().item() > 0.99


def test_fp8_ops_take_empty_batches(device):
    x = torch.empty(0, 5, 8, device=device)
    w = torch.ones(8, device=device)
    residual, q, scale = adaln_rms_norm_fp8(x, w, x)
    assert residual.shape == q.shape == (0, 5, 8) and scale.shape == (0, 5) and q.dtype == FP8
    q, scale = swiglu_fp8(torch.empty(0, 6, device=device))
    assert q.shape == (0, 3) and scale.shape == (0,)
    wq, ws = quantize_rows(torch.randn(4, 8))
    out = fp8_linear(torch.empty(0, 8, dtype=FP8), torch.empty(0), wq, ws)
    assert out.shape == (0, 4) and out.dtype == torch.bfloat16


def test_fp8_linear_is_the_product_of_its_dequantized_operands(rng):
    x = torch.randn(3, 5, 32, generator=rng)
    w = torch.randn(24, 32, generator=rng)
    bias = torch.randn(24, generator=rng)
    q, qs = quantize_rows(x)
    wq, ws = quantize_rows(w)
    out = fp8_linear(q, qs, wq, ws, bias, out_dtype=torch.float32)
    exact = dequantize_rows(q, qs).double() @ dequantize_rows(wq, ws).double().t() + bias.double()
    torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=1e-5)
    assert out.shape == (3, 5, 24)
    full = x.double() @ w.double().t() + bias.double()
    assert ((out.double() - full).norm() / full.norm()).item() < 0.05  # the operands' rounding
    torch.testing.assert_close(
        fp8_linear_reference(q, qs, wq, ws, bias, out_dtype=torch.float32), out
    )


def test_fp8_linear_and_quantize_check_their_arguments(rng):
    wq, ws = quantize_rows(torch.randn(8, 16, generator=rng))
    q, qs = quantize_rows(torch.randn(4, 16, generator=rng))
    with pytest.raises(TypeError, match=r"q must be torch\.float8_e4m3fn"):
        fp8_linear(q.to(torch.float32), qs, wq, ws)
    with pytest.raises(TypeError, match="weight_q must be"):
        fp8_linear(q, qs, wq.to(torch.float32), ws)
    with pytest.raises(ValueError, match=r"q must be \(\.\.\., K\) with K = 16"):
        fp8_linear(q[:, :8], qs, wq, ws)
    with pytest.raises(ValueError, match=r"q_scale must be float32 of shape \(4,\)"):
        fp8_linear(q, qs[:3], wq, ws)
    with pytest.raises(ValueError, match=r"weight_scale must be float32 of shape \(8,\)"):
        fp8_linear(q, qs, wq, ws.double())
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        fp8_linear(q, qs, wq, ws, torch.ones(3))
    with pytest.raises(TypeError, match="x must be a float16/bfloat16/float32/float64"):
        quantize_rows(torch.ones(3, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="non-empty last dimension"):
        quantize_rows(torch.ones(3, 0))
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        adaln_rms_norm_fp8(torch.randn(2, 3, 8), torch.ones(4), torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match="gate_up"):
        swiglu_fp8(torch.randn(2, 5))


@pytest.mark.gpu
def test_fp8_linear_on_hopper_is_its_reference():
    """On a card with FP8 tensor cores the cuBLASLt GEMM with row-wise scales gives the float32
    product of the dequantized operands, rounded to bf16 (the published block's shapes, a
    bias, rows that are no multiple of a tile)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs a CUDA card of compute capability 8.9 or later")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1000, 2048, generator=gen).cuda().to(torch.bfloat16)
    w = (torch.randn(6144, 2048, generator=gen) * 0.02).cuda().to(torch.bfloat16)
    bias = torch.randn(6144, generator=gen).cuda().to(torch.bfloat16)
    q, qs = quantize_rows(x)
    wq, ws = quantize_rows(w)
    got = fp8_linear(q, qs, wq, ws, bias)
    want = fp8_linear_reference(q, qs, wq, ws, bias, out_dtype=torch.float32)
    assert got.dtype == torch.bfloat16
    assert ((got.float() - want).norm() / want.norm()).item() < 4e-3  # bf16's rounding
