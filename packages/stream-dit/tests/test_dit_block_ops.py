"""The fused transformer-block ops (AdaLN norm, QK norm + rotary, SwiGLU, banded attention)
against their float64 references under the interpreter, their checks, and their GPU launches
compiled for sm_90."""

import pytest
import torch

from stream_dit.ops.adaln_norm import (
    adaln_rms_norm,
    adaln_rms_norm_reference,
    rms_norm_modulate,
)
from stream_dit.ops.attention import attention, attention_reference
from stream_dit.ops.attention_weights import attention_weights, attention_weights_reference
from stream_dit.ops.head_values import head_values, head_values_reference
from stream_dit.ops.qk_norm_rotary import qk_norm_rotary_, qk_norm_rotary_reference_, rotary_tables
from stream_dit.ops.swiglu import swiglu, swiglu_reference
from triton_dispatch.compile_check import compile_recorded, recorded_launches, unavailable_reason
from triton_dispatch.declaration import Call
from triton_dispatch.testing import assert_close

DTYPES = [torch.float32, torch.float16]


def _f64(*tensors):
    return [None if t is None else t.double().cpu() for t in tensors]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("modulated", [True, False])
def test_adaln_rms_norm_matches_float64(rng, device, dtype, gated, modulated):
    b, n, width = 3, 7, 40  # width not a power of two: masked columns
    x, delta = (torch.randn(b, n, width, generator=rng).to(device, dtype) for _ in range(2))
    weight = torch.randn(width, generator=rng).to(device, dtype)
    mod = torch.randn(b, 6, width, generator=rng).to(device, dtype)  # row-strided views
    gate = mod[:, 2] if gated else None
    scale, shift = (mod[:, 1], mod[:, 0]) if modulated else (None, None)
    residual, normed = adaln_rms_norm(x, weight, delta, gate=gate, scale=scale, shift=shift)
    ref_res, ref_norm = adaln_rms_norm_reference(*_f64(x, weight, delta, gate, scale, shift))
    assert_close(residual, ref_res, dtype=dtype, name="residual")
    assert_close(normed, ref_norm, dtype=dtype, name="normed")
    alone = rms_norm_modulate(x, weight, scale=scale, shift=shift)
    assert_close(alone, adaln_rms_norm_reference(*_f64(x, weight), None, None,
                                                 *_f64(scale, shift))[1], dtype=dtype)  # fmt: skip


def test_adaln_rms_norm_checks_its_arguments(rng):
    x = torch.randn(2, 3, 8, generator=rng)
    w = torch.ones(8)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        adaln_rms_norm(x, torch.ones(4), x)
    with pytest.raises(ValueError, match="scale and shift go together"):
        rms_norm_modulate(x, w, scale=torch.ones(2, 8))
    with pytest.raises(ValueError, match=r"gate must have shape \(2, 8\)"):
        adaln_rms_norm(x, w, x, gate=torch.ones(3, 8))
    with pytest.raises(ValueError, match="delta must match x"):
        adaln_rms_norm(x, w, x.half())
    with pytest.raises(ValueError, match="x must have shape"):
        rms_norm_modulate(x[0], w)
    with pytest.raises(ValueError, match="unit stride"):
        rms_norm_modulate(x, w, scale=torch.ones(8, 2).t(), shift=torch.ones(2, 8))
    with pytest.raises(TypeError, match="eps"):
        rms_norm_modulate(x, w, eps="1e-6")


def test_block_ops_take_empty_batches(device):
    x = torch.empty(0, 5, 8, device=device)
    w = torch.ones(8, device=device)
    residual, normed = adaln_rms_norm(x, w, x)
    assert residual.shape == normed.shape == (0, 5, 8)
    assert swiglu(torch.empty(0, 6, device=device)).shape == (0, 3)
    q = torch.empty(0, 4, 2, 16, device=device)
    assert attention(q, q, q, scale=0.25).shape == (0, 4, 2, 16)
    assert qk_norm_rotary_(torch.empty(0, 3, 32, device=device), w.new_ones(16), w.new_ones(16),
                           q_heads=1, k_heads=1).shape == (0, 3, 32)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(4, 2, True), (3, 0, False), (0, 2, False)])
def test_qk_norm_rotary_matches_float64_and_leaves_values(rng, device, dtype, heads):
    q_heads, k_heads, rotary = heads
    b, n, d = 2, 9, 16
    width = (q_heads + 2 * max(k_heads, 1)) * d
    x = torch.randn(b, n, width, generator=rng).to(device, dtype)
    wq, wk = (torch.randn(d, generator=rng).to(device, dtype) for _ in range(2))
    cos, sin = rotary_tables(n + 3, d, 1e4, device) if rotary else (None, None)  # longer tables
    out = qk_norm_rotary_(x.clone(), wq, wk, cos, sin, q_heads=q_heads, k_heads=k_heads)
    ref = x.double().cpu()
    qk_norm_rotary_reference_(ref, *_f64(wq, wk, cos, sin), q_heads=q_heads, k_heads=k_heads)
    assert_close(out, ref, dtype=dtype)
    done = (q_heads + k_heads) * d
    assert torch.equal(out[..., done:], x[..., done:])  # values untouched, bit for bit


def test_rotary_tables_are_diffusers_tables():
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    cos, sin = rotary_tables(11, 16, 1e6, "cpu")
    ref_cos, ref_sin = get_1d_rotary_pos_embed(16, torch.arange(11.0), theta=1e6, use_real=True,
                                               repeat_interleave_real=False)  # fmt: skip
    torch.testing.assert_close(cos, ref_cos.float())
    torch.testing.assert_close(sin, ref_sin.float())


def test_qk_norm_rotary_checks_its_arguments(rng):
    x = torch.randn(1, 4, 64, generator=rng)
    w = torch.ones(16)
    with pytest.raises(ValueError, match="do not fit"):
        qk_norm_rotary_(x, w, w, q_heads=4, k_heads=1)
    with pytest.raises(ValueError, match="power of two"):
        qk_norm_rotary_(x, torch.ones(12), torch.ones(12), q_heads=1, k_heads=1)
    with pytest.raises(ValueError, match="one size"):
        qk_norm_rotary_(x, w, torch.ones(8), q_heads=1, k_heads=1)
    cos, sin = rotary_tables(3, 16, 1e4, "cpu")
    with pytest.raises(ValueError, match=r"cos must have shape \(>= 4, 16\)"):
        qk_norm_rotary_(x, w, w, cos, sin, q_heads=1, k_heads=1)
    with pytest.raises(ValueError, match="q_heads"):
        qk_norm_rotary_(x, w, w, q_heads=-1, k_heads=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_matches_float64(rng, device, dtype):
    x = torch.randn(3, 5, 2 * 37, generator=rng).to(device, dtype) * 3
    assert_close(swiglu(x), swiglu_reference(x.double().cpu()), dtype=dtype)
    with pytest.raises(ValueError, match="gate_up must have shape"):
        swiglu(x[..., :-1].contiguous())
    with pytest.raises(ValueError, match="contiguous"):
        swiglu(x.transpose(0, 1))


def _qkv(rng, b, n, m, heads, kv_heads, d, device, dtype):
    """q read from a fused projection (row-strided), k and v from another, as the model does."""
    q = torch.randn(b, n, heads * d + 8, generator=rng)[..., : heads * d]
    kv = torch.randn(b, m, 2 * kv_heads * d, generator=rng)
    k, v = kv.split(kv_heads * d, -1)
    return [t.to(device, dtype).unflatten(-1, (-1, d)) for t in (q, k, v)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [-1, 0, 5, 40])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_matches_float64(rng, device, dtype, window, masked):
    """37 tokens: up to a window of 36 the flash kernel's banded blocks, past it the few-keys
    kernel (every key in one tile); see the test below for many keys without a window."""
    b, n, heads, kv_heads, d = 2, 37, 4, 2, 16
    q, k, v = _qkv(rng, b, n, n, heads, kv_heads, d, device, dtype)
    mask = None
    if masked:  # a padded row and a strided mask (every second frame of a frame mask)
        frames = torch.rand(b, 2 * n, generator=rng) > 0.3
        frames[0, 2 * 25 :] = False
        mask = frames.to(device)[:, ::2]
    out = attention(q, k, v, mask, scale=0.3, window=window)
    ref = attention_reference(*_f64(q, k, v), None if mask is None else mask.cpu(), scale=0.3,
                              window=window)  # fmt: skip
    assert out.is_contiguous() and out.shape == q.shape
    assert_close(out, ref, dtype=dtype)


@pytest.mark.parametrize("masked", [False, True])
def test_attention_many_keys_without_window_matches_float64(rng, device, masked):
    """More keys than one tile holds and no window: the flash kernel's online softmax."""
    q, k, v = _qkv(rng, 1, 20, 140, 2, 1, 16, device, torch.float32)
    mask = (torch.rand(1, 140, generator=rng) > 0.5).to(device) if masked else None
    out = attention(q, k, v, mask, scale=0.3)
    ref = attention_reference(*_f64(q, k, v), None if mask is None else mask.cpu(), scale=0.3)
    assert_close(out, ref, dtype=torch.float32)


@pytest.mark.parametrize(("window", "heads", "kv_heads"), [(20, 4, 2), (37, 3, 1), (70, 4, 1)])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_band_inner_and_edge_blocks_match_float64(rng, device, window, heads,
                                                             kv_heads, masked):  # fmt: skip
    """A window over many keys: key blocks inside every query's band run without the band's
    and the bounds' checks, the blocks at its edges and the keys' end with them; query heads
    sharing a key/value head in pairs (groups of 2 and 4) or alone (3)."""
    q, k, v = _qkv(rng, 2, 150, 150, heads, kv_heads, 16, device, torch.float32)
    mask = None
    if masked:
        mask = (torch.rand(2, 150, generator=rng) > 0.2).to(device)
        mask[1, 90:] = False
    out = attention(q, k, v, mask, scale=0.3, window=window)
    ref = attention_reference(*_f64(q, k, v), None if mask is None else mask.cpu(), scale=0.3,
                              window=window)  # fmt: skip
    assert_close(out, ref, dtype=torch.float32)


@pytest.mark.parametrize("norms", ["none", "q", "qk"])
def test_attention_cross_shape_and_queries_with_no_key(rng, device, norms):
    """Few keys (cross-attention to conditioning tokens), the query and key norms folded in or
    not; a row with no key gets zeros."""
    q, k, v = _qkv(rng, 3, 21, 5, 4, 1, 16, device, torch.float32)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    qw = torch.randn(16, generator=rng).to(device) if "q" in norms else None
    kw = torch.randn(16, generator=rng).to(device) if "k" in norms else None
    out = attention(q, k, v, mask.to(device), scale=0.25, q_weight=qw, k_weight=kw, eps=1e-5)
    ref = attention_reference(*_f64(q, k, v), mask, *_f64(qw, kw), scale=0.25, eps=1e-5)
    assert_close(out, ref, dtype=torch.float32)
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_attention_checks_its_arguments(rng):
    q, k, v = _qkv(rng, 2, 8, 8, 4, 2, 16, "cpu", torch.float32)
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        attention(q[:, :, :3], k, v, scale=1.0)
    with pytest.raises(ValueError, match=r"key_mask must be \(2, 8\)"):
        attention(q, k, v, torch.ones(2, 7, dtype=torch.bool), scale=1.0)
    with pytest.raises(TypeError, match="key_mask must be bool"):
        attention(q, k, v, torch.ones(2, 8), scale=1.0)
    with pytest.raises(ValueError, match="unit stride along head_dim"):
        attention(torch.randn(2, 8, 16, 4).transpose(2, 3), k, v, scale=1.0)
    with pytest.raises(ValueError, match="window"):
        attention(q, k, v, scale=1.0, window=-2)
    with pytest.raises(ValueError, match=r"q_weight must have shape \(16,\)"):
        attention(q, k, v, scale=1.0, q_weight=torch.ones(8))
    with pytest.raises(ValueError, match="scale"):
        attention(q, k, v, scale=float("nan"))
    with pytest.raises(TypeError, match="share a dtype"):
        attention(q, k.half(), v.half(), scale=1.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norms", [False, True])
def test_attention_weights_match_float64(rng, device, dtype, norms):
    """Few keys, grouped heads, a padded mask with a row that has no key (zero weights)."""
    q, k, _ = _qkv(rng, 3, 21, 5, 4, 2, 16, device, dtype)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    qw, kw = (torch.randn(16, generator=rng).to(device, dtype) if norms else None for _ in "qk")
    out = attention_weights(q, k, mask.to(device), scale=0.25, q_weight=qw, k_weight=kw, eps=1e-5)
    ref = attention_weights_reference(*_f64(q, k), mask, *_f64(qw, kw), scale=0.25, eps=1e-5)
    assert out.shape == (3, 21, 4, 5) and out.is_contiguous()
    assert_close(out, ref, dtype=dtype)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    real = out[0].float().sum(-1)  # each query's weights over its keys sum to one
    torch.testing.assert_close(real, torch.ones_like(real), atol=5e-3, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_head_values_match_float64_and_fold_the_output_projection(rng, device, dtype):
    """Values read in place from a fused key/value projection (strided), grouped heads, an odd
    output width; weights times them equal the attention through the projection."""
    kv = torch.randn(2, 7, 2 * 2 * 16, generator=rng).to(device, dtype)
    k, v = (p.unflatten(-1, (2, 16)) for p in kv.split([32, 32], -1))
    weight = torch.randn(40, 4 * 16, generator=rng).to(device, dtype)
    out = head_values(v, weight, heads=4)
    assert out.shape == (2, 4 * 7, 40)
    assert_close(out, head_values_reference(*_f64(v, weight), heads=4), dtype=dtype)
    q = torch.randn(2, 9, 4, 16, generator=rng).to(device, dtype)
    mask = torch.tensor([[1, 1, 0, 1, 1, 1, 0], [1, 0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    folded = attention_weights(q, k, mask.to(device), scale=0.3).flatten(2).double() @ out.double()
    direct = attention_reference(*_f64(q, k, v), mask, scale=0.3).flatten(2) @ _f64(weight)[0].T
    assert_close(folded.to(dtype), direct, dtype=dtype)


def test_attention_weights_and_head_values_check_their_arguments(rng):
    q, k, v = _qkv(rng, 2, 8, 8, 4, 2, 16, "cpu", torch.float32)
    with pytest.raises(ValueError, match="at most 128 keys"):
        attention_weights(q, torch.randn(2, 129, 2, 16), scale=1.0)
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        attention_weights(q[:, :, :3], k, scale=1.0)
    with pytest.raises(TypeError, match="share a dtype"):
        attention_weights(q, k.half(), scale=1.0)
    with pytest.raises(ValueError, match=r"key_mask must be \(2, 8\)"):
        attention_weights(q, k, torch.ones(2, 7, dtype=torch.bool), scale=1.0)
    weight = torch.randn(24, 64)
    with pytest.raises(ValueError, match=r"weight must be \(D_out, heads·d = 64\)"):
        head_values(v, torch.randn(24, 48), heads=4)
    with pytest.raises(ValueError, match="multiple of v's heads"):
        head_values(v, torch.randn(24, 48), heads=3)
    with pytest.raises(TypeError, match="share a dtype"):
        head_values(v, weight.half(), heads=4)
    with pytest.raises(ValueError, match="at most 128 values"):
        head_values(torch.randn(1, 129, 2, 16), weight, heads=4)
    assert head_values(v[:, :0], weight, heads=4).shape == (2, 0, 24)
    assert attention_weights(q, k[:, :0], scale=1.0).shape == (2, 8, 4, 0)


def test_cross_values_fold_from_long_rows():
    from stream_dit.model.ace_step_fused import folds_cross_values

    assert folds_cross_values(750, 64, 128)  # 60 s rows of ACE-Step 1.5
    assert not folds_cross_values(125, 64, 128)  # 10 s rows: the values' share is small
    assert not folds_cross_values(10_000, 128, 128)  # as many keys as the head is wide


@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_gpu_launches_compile_for_sm90(rng):
    """The launches CUDA plans bind (GPU blocks, bf16, the published ACE-Step head size) compile
    for an sm_90 GPU."""
    from stream_dit.ops.adaln_norm.kernels import adaln_rms_norm_plan
    from stream_dit.ops.attention.kernels import attention_plan
    from stream_dit.ops.attention_weights.kernels import attention_weights_plan
    from stream_dit.ops.head_values.kernels import head_values_plan
    from stream_dit.ops.qk_norm_rotary.kernels import qk_norm_rotary_plan
    from stream_dit.ops.swiglu.kernels import swiglu_fp8_plan, swiglu_plan

    bf = torch.bfloat16
    x = torch.randn(2, 6, 2048).to(bf)
    w = torch.ones(2048, dtype=bf)
    mod = torch.randn(2, 6, 2048).to(bf)
    qkv = torch.randn(2, 6, 4096).to(bf)
    q, k, v = (p.unflatten(-1, (-1, 128)) for p in qkv.split([2048, 1024, 1024], -1))
    cos, sin = rotary_tables(6, 128, 1e6, "cpu")
    hw = torch.ones(128, dtype=bf)
    mask = torch.ones(2, 6, dtype=torch.bool)
    with recorded_launches() as calls:
        for tensors, settings in (
            (dict(x=x, weight=w, delta=x, gate=mod[:, 2], scale=mod[:, 1], shift=mod[:, 0]),
             dict(eps=1e-6)),
            (dict(x=x, weight=w, scale=None, shift=None), dict(eps=1e-6)),
        ):  # fmt: skip
            for fp8 in (False, True):  # normed rows in bf16, or as e4m3 with their scales
                adaln_rms_norm_plan(Call(tensors, settings, x.device, "triton"), fp8=fp8).forward(
                    *tensors.values()
                )
        t = dict(x=qkv, weight_q=hw, weight_k=hw, cos=cos, sin=sin)
        s = dict(q_heads=16, k_heads=8, eps=1e-6)
        qk_norm_rotary_plan(Call(t, s, x.device, "triton")).forward(*t.values())
        t = dict(gate_up=torch.randn(2, 6, 2 * 6144).to(bf))
        swiglu_plan(Call(t, {}, x.device, "triton")).forward(*t.values())
        swiglu_fp8_plan(Call(t, {}, x.device, "triton")).forward(*t.values())
        # a window narrower than the 200 tokens (the flash kernel), then few keys with the norms
        long = torch.randn(1, 200, 4096).to(bf)
        lq, lk, lv = (p.unflatten(-1, (-1, 128)) for p in long.split([2048, 1024, 1024], -1))
        for qkv_, window, key_mask, weight in (((lq, lk, lv), 128, None, None),
                                               ((q, k, v), -1, mask, hw)):  # fmt: skip
            t = dict(zip("qkv", qkv_), key_mask=key_mask, q_weight=weight, k_weight=weight)
            s = dict(scale=128**-0.5, window=window, eps=1e-6)
            attention_plan(Call(t, s, x.device, "triton")).forward(*t.values())
        # the folded cross-attention: weights over 64 keys, values through the projection
        cross = torch.randn(2, 64, 2048).to(bf)
        ck, cv = (p.unflatten(-1, (-1, 128)) for p in cross.split([1024, 1024], -1))
        keys = torch.ones(2, 64, dtype=torch.bool)
        t = dict(q=q, k=ck, key_mask=keys, q_weight=hw, k_weight=hw)
        s = dict(scale=128**-0.5, eps=1e-6)
        attention_weights_plan(Call(t, s, x.device, "triton")).forward(*t.values())
        t = dict(v=cv, weight=torch.randn(256, 2048).to(bf))  # D_out is no constexpr
        head_values_plan(Call(t, dict(heads=16), x.device, "triton")).forward(*t.values())
    names = sorted({name for _, name, _ in calls})
    assert names == ["_adaln_rms_norm_kernel", "_attention_kernel", "_few_keys_attention_kernel",
                     "_head_values_kernel", "_qk_norm_rotary_kernel", "_swiglu_fp8_kernel",
                     "_swiglu_kernel"]  # fmt: skip
    assert len({(name, str(meta)) for _, name, meta in calls}) > len(names)
    assert compile_recorded(calls) == []
