import pytest
import torch

from stream_dit.model import PRESETS, DenoiserAdapter, DiTConfig, build_model


def _inputs(rng, b=3, t=10, n=5):
    x = torch.randn(b, t, 64, generator=rng)
    s = torch.randn(b, n, 32, generator=rng)
    return x, torch.rand(b, generator=rng), s, torch.ones(b, n, dtype=torch.bool)


def test_seeded_weights_are_deterministic_and_seed_dependent(tiny_model):
    again = build_model("tiny", seed=0)
    other = build_model("tiny", seed=1)
    a = dict(tiny_model.named_parameters())
    assert all(torch.equal(p, a[n]) for n, p in again.named_parameters())
    assert any(not torch.equal(p, a[n]) for n, p in other.named_parameters())
    assert isinstance(tiny_model, DenoiserAdapter)


def test_rows_are_independent_and_padding_is_masked(tiny_model, rng):
    x, t, s, mask = _inputs(rng)
    mask[1, 3:] = False
    frame_mask = torch.ones(3, 10, dtype=torch.bool)
    frame_mask[2, 6:] = False
    v = tiny_model(x, t, s, mask, frame_mask)
    assert v.shape == x.shape and v.dtype == torch.float32 and torch.isfinite(v).all()
    # row 1 alone with its unpadded conditioning
    v1 = tiny_model(x[1:2], t[1:2], s[1:2, :3], mask[1:2, :3])
    torch.testing.assert_close(v[1], v1[0], rtol=1e-5, atol=1e-5)
    # row 2 alone at its own length: padded frames must not leak into real ones
    v2 = tiny_model(x[2:3, :6], t[2:3], s[2:3], mask[2:3])
    torch.testing.assert_close(v[2, :6], v2[0], rtol=1e-5, atol=1e-5)


def test_fully_masked_conditioning_is_finite_and_differs(tiny_model, rng):
    x, t, s, mask = _inputs(rng, b=1)
    uncond = tiny_model(x, t, s, torch.zeros_like(mask))
    cond = tiny_model(x, t, s, mask)
    assert torch.isfinite(uncond).all()
    assert not torch.allclose(uncond, cond)


def test_patched_model_and_odd_lengths(rng):
    model = build_model("tiny", seed=3, patch=2)
    x, t, s, mask = _inputs(rng, b=2, t=7)
    v = model(x, t, s, mask)
    assert v.shape == (2, 7, 64) and torch.isfinite(v).all()


def test_zero_init_gives_zero_velocity(rng):
    model = build_model("tiny").reset_parameters(0, zero_init=True)
    x, t, s, mask = _inputs(rng, b=1)
    assert torch.count_nonzero(model(x, t, s, mask)) == 0


def test_bad_presets_and_configs():
    with pytest.raises(ValueError, match="preset"):
        build_model("huge")
    with pytest.raises(ValueError, match="heads"):
        DiTConfig(hidden=30, depth=1, heads=4, cond_dim=8)
    with pytest.raises(TypeError):
        build_model(3)
    assert PRESETS["large"].hidden >= 1024 and PRESETS["large"].latent_channels == 64
