"""The pieces of the colpali-engine / PyLate patchers that need neither library: the mask
translations, the entry points those libraries' own backends call, and the patch bookkeeping.
The patchers against the real libraries are tested in ``integration-tests/``."""

from __future__ import annotations

import importlib.util
import types

import pytest
import torch

from late_interaction_kernels import autograd, mps
from late_interaction_kernels.integrations import (
    UnsupportedVersionError,
    _patching,
    patch_colpali_engine,
    patch_pylate,
)
from late_interaction_kernels.integrations._scoring import zero_padding_masks
from triton_dispatch.testing import assert_close


def einsum_maxsim(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """colpali-engine's reference: padding (zero rows) takes part with similarity 0."""
    q, d = q.double(), d.double()
    if d.dim() == 3:
        return torch.einsum("bnd,csd->bcns", q, d).amax(dim=3).sum(dim=2)
    return torch.einsum("bnd,bksd->bkns", q, d).amax(dim=3).sum(dim=2)


def multiply_mask_maxsim(q, d, q_mask, d_mask):
    """PyLate's reference: similarities multiplied by the masks."""
    sim = torch.einsum("ash,bth->abst", q.double(), d.double())
    sim = sim * q_mask.double()[:, None, :, None] * d_mask.double()[None, :, None, :]
    return sim.amax(dim=-1).sum(dim=-1)


def zero_padded(rng, *shape, lengths, left=False):
    x = torch.randn(*shape, generator=rng)
    pos = torch.arange(shape[-2])
    lens = torch.tensor(lengths).reshape(*shape[:-2], 1)
    valid = pos >= shape[-2] - lens if left else pos < lens
    return x * valid.unsqueeze(-1)


@pytest.mark.parametrize("left", [False, True])
def test_zero_padding_masks_keep_one_padding_row(left, rng):
    d = zero_padded(rng, 3, 5, 4, lengths=[5, 2, 0], left=left)
    mask = zero_padding_masks(d)
    assert mask.dtype == torch.bool and mask.shape == (3, 5)
    assert mask[0].all()  # no padding: every token valid
    assert mask[1].sum() == 3 and mask[2].sum() == 1  # the real tokens + one zero row
    assert (d.ne(0).any(-1) <= mask).all()


@pytest.mark.parametrize("left", [False, True])
def test_autograd_entry_matches_zero_padding_einsum(left, rng):
    # random signs: many query tokens have only negative similarities, where padding's 0 wins
    q = zero_padded(rng, 2, 4, 8, lengths=[4, 2]).requires_grad_(True)
    d = zero_padded(rng, 3, 5, 8, lengths=[5, 1, 0], left=left).requires_grad_(True)
    got = autograd.maxsim(q, d)
    assert got.shape == (2, 3) and got.dtype == torch.float32
    assert_close(got, einsum_maxsim(q, d), name="scores")
    valid_q = q.detach().ne(0).any(-1, keepdim=True)
    g = torch.randn(2, 3, generator=rng)
    got_q = torch.autograd.grad(got, q, g)[0]
    want_q = torch.autograd.grad(einsum_maxsim(q, d).float(), q, g)[0]
    assert_close(got_q * valid_q, (want_q * valid_q).double(), name="d/dquery")


def test_autograd_entry_candidate_layout(rng):
    q = zero_padded(rng, 2, 3, 8, lengths=[3, 1])
    d = zero_padded(rng, 2, 3, 4, 8, lengths=[4, 2, 1, 3, 0, 4])
    assert_close(autograd.maxsim(q, d), einsum_maxsim(q, d), name="scores")


def test_autograd_entry_keeps_multiply_mask_semantics(rng):
    q = torch.randn(2, 4, 8, generator=rng)
    d = torch.randn(3, 5, 8, generator=rng)  # masked tokens are not zero vectors here
    q_mask = (torch.rand(2, 4, generator=rng) > 0.3).float()
    d_mask = torch.rand(3, 5, generator=rng) > 0.5
    d_mask[2] = False
    got = autograd.maxsim(q, d, q_mask, d_mask)
    assert_close(got, multiply_mask_maxsim(q, d, q_mask, d_mask), name="scores")


def test_mps_entry_normalizes(rng):
    q = torch.randn(2, 3, 8, generator=rng)
    d = torch.randn(2, 4, 8, generator=rng)
    got = mps.maxsim_mps(q, d, normalize=True)
    nq, nd = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(d, dim=-1)
    assert_close(got, einsum_maxsim(nq, nd), name="scores")


class _Base:
    def method(self):
        return "base"


class _Child(_Base):
    own = 1


def _with_default(x=len):
    return x


def test_patch_set_restores_every_object_by_identity():
    module = types.ModuleType("fake")
    module.fn = len
    patches = _patching.PatchSet("fake")
    originals = (module.fn, _Child.__dict__["own"], _with_default.__defaults__)
    patches.replace(module, "fn", abs)
    patches.replace(_Child, "own", 2)
    patches.replace(_Child, "method", lambda self: "patched")  # inherited, not owned
    patches.swap_defaults([_with_default], {id(len): len}, lambda fn: abs)
    assert (module.fn, _Child.own, _Child().method(), _with_default()) == (abs, 2, "patched", abs)
    patches.restore()
    assert module.fn is originals[0] and _Child.__dict__["own"] is originals[1]
    assert "method" not in _Child.__dict__ and _Child().method() == "base"
    assert _with_default.__defaults__ == originals[2] and _with_default() is len
    assert not patches.active


def test_patch_set_refuses_unknown_attributes():
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        _patching.PatchSet("fake").replace(_Child, "missing", 1)


@pytest.mark.parametrize(
    ("text", "release"),
    [("0.3.18", (0, 3, 18)), ("1.0.0rc1", (1, 0, 0)), ("0.3.11+local", (0, 3, 11)), ("2", (2,))],
)
def test_release_parsing(text, release):
    assert _patching._release(text) == release


def test_version_range_errors(monkeypatch):
    monkeypatch.setattr(_patching, "version", lambda dist: "0.3.10")
    with pytest.raises(
        UnsupportedVersionError, match=r"lib 0\.3\.10 is not supported.*>=0\.3\.11,<1"
    ):
        _patching.installed_version("lib", minimum="0.3.11", below="1")
    monkeypatch.undo()
    with pytest.raises(ImportError, match="not installed"):
        _patching.installed_version("surely-not-a-real-distribution", minimum="1", below=None)


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_disable_variable(value, monkeypatch):
    monkeypatch.setenv(_patching.DISABLE_ENV_VAR, value)
    assert _patching.patching_disabled()
    assert patch_colpali_engine() is False and patch_pylate() is False


def test_routing_rule(rng, device, monkeypatch):
    x = torch.randn(2, 3, generator=rng).to(device)
    assert _patching.routes_to_kernels(x, x)  # CUDA, or CPU under the interpreter
    assert not _patching.routes_to_kernels([x], x)
    assert not _patching.routes_to_kernels(x.double(), x.double())
    monkeypatch.setenv("TRITON_DISPATCH_BACKEND", "torch")
    assert not _patching.routes_to_kernels(x, x)


@pytest.mark.skipif(importlib.util.find_spec("colpali_engine") is not None, reason="installed")
def test_patch_colpali_engine_without_the_library_names_the_extra():
    with pytest.raises(ImportError, match="colpali-engine is not installed"):
        patch_colpali_engine()


@pytest.mark.skipif(importlib.util.find_spec("pylate") is not None, reason="installed")
def test_patch_pylate_without_the_library_names_the_extra():
    with pytest.raises(ImportError, match="pylate is not installed"):
        patch_pylate()
