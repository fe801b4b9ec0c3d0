"""Shared builders for the EMA tests: random state and the float64 reference run."""

from __future__ import annotations

import torch

from triton_dispatch.testing import assert_close, randint, randn
from vq_kernels.ops.ema_update.reference import ema_update_reference_


def make_state(levels, num_codes, dim, *, rng, semantics="active_only", device="cpu"):
    """Random EMA state (fp32) whose counters and sizes sit on both sides of the default
    thresholds, so that a step restarts some codes but not all."""
    codebook = randn((levels, num_codes, dim), generator=rng, device=device)
    if semantics == "active_only":
        size = torch.rand(levels, num_codes, generator=rng).to(device) * 3 + 0.1
    else:  # some above, some below the default expiry threshold of 2
        size = torch.rand(levels, num_codes, generator=rng).to(device) * 4
    embed_sum = randn((levels, num_codes, dim), generator=rng, device=device)
    counter = randint(0, 22, (levels, num_codes), generator=rng, device=device, dtype=torch.int32)
    return codebook, size, embed_sum, counter


def reference_step(x, codes, state, candidates, *, decay, eps=1e-5, semantics, threshold):
    """The float64 reference on copies of ``state``; returns (new state list, replaced)."""
    ref = [t.detach().to(torch.float64) if t.is_floating_point() else t.clone() for t in state]
    replaced = ema_update_reference_(
        x.detach().to(torch.float64),
        codes,
        *ref,
        candidates,
        decay=decay,
        eps=eps,
        semantics=semantics,
        threshold=threshold,
    )
    return ref, replaced


def assert_state_matches(state, ref, replaced, ref_replaced, *, tol=None):
    assert torch.equal(replaced.cpu(), ref_replaced.cpu()), "restarted codes differ"
    names = ("codebook", "cluster_size", "embed_sum")
    for name, out, want in zip(names, state[:3], ref[:3]):
        assert torch.isfinite(out).all(), f"{name} holds non-finite values"
        assert_close(out, want, dtype=torch.float32, tol=tol, name=name)
    assert torch.equal(state[3].cpu().long(), ref[3].cpu().long()), "steps_since_active differs"
