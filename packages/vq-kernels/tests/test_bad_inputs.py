"""Every public op of vq-kernels through the shared bad-input kit (tiny shapes)."""

import pytest
import torch

from triton_dispatch.testing import (
    OpSpec,
    TensorArg,
    bad_input_params,
    check_bad_input,
    randint,
    randn,
)
from vq_kernels import ema_statistics, ema_update_, perplexity, quantize
from vq_kernels.ops.ema_update.reference import ema_statistics_reference, ema_update_reference_
from vq_kernels.ops.quantize.reference import distances_reference, quantize_reference

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
CODES = (torch.int32, torch.int64)
L, B, K, D = 2, 6, 4, 3


def _chosen_distance(inputs, returned):
    """The float64 distance of each row to the code it got: ties may pick either code."""
    codes = returned[0] if isinstance(returned, tuple) else returned
    x = inputs["x"].detach().double().reshape(-1, inputs["x"].shape[-1])
    d = distances_reference(x, inputs["codebook"].detach().double(), "l2")
    return d.gather(1, codes.reshape(-1, 1).long())[:, 0]


QUANTIZE = OpSpec(
    "quantize",
    quantize,
    quantize_reference,
    lambda g: {"x": randn((B, D), generator=g), "codebook": randn((K, D), generator=g)},
    [TensorArg("x", ranks=(1, 2, 3), dtypes=FLOATS), TensorArg("codebook", dtypes=FLOATS)],
    result=_chosen_distance,
    tol=1e-5,
)


def _statistics_inputs(g):
    return {
        "x": randn((L, B, D), generator=g),
        "codes": randint(0, K, (L, B), generator=g),
        "num_codes": K,
    }


EMA_STATISTICS = OpSpec(
    "ema_statistics",
    ema_statistics,
    ema_statistics_reference,
    _statistics_inputs,
    [
        TensorArg("x", ranks=(2, 3), dtypes=FLOATS),
        TensorArg("codes", ranks=(1, 2), dtypes=CODES, index_range=(0, K)),
    ],
    tol=1e-3,  # fp16 x sums in fp32
)

STATE = ("codebook", "cluster_size", "embed_sum", "steps_since_active")


def _update_inputs(g):
    return {
        "x": randn((L, B, D), generator=g),
        "codes": randint(0, K, (L, B), generator=g),
        "codebook": randn((L, K, D), generator=g),
        "cluster_size": torch.rand((L, K), generator=g) + 0.5,
        "embed_sum": randn((L, K, D), generator=g),
        "steps_since_active": randint(0, 3, (L, K), generator=g, dtype=torch.int32),
    }


def _update_reference(x, codes, codebook, cluster_size, embed_sum, steps_since_active, **kw):
    candidates = torch.zeros(steps_since_active.shape, dtype=torch.int64)
    ema_update_reference_(
        x,
        codes,
        codebook,
        cluster_size,
        embed_sum,
        steps_since_active,
        candidates,
        threshold=None,
        **kw,
    )


EMA_UPDATE = OpSpec(
    "ema_update_",
    ema_update_,
    _update_reference,
    _update_inputs,
    [
        TensorArg("x", ranks=(2, 3), dtypes=FLOATS),
        TensorArg("codes", ranks=(1, 2), dtypes=CODES, index_range=(0, K)),
        TensorArg("codebook", dtypes=FLOATS),
        TensorArg("cluster_size", dtypes=(torch.float32, torch.float64)),
        TensorArg("embed_sum", dtypes=(torch.float32, torch.float64)),
        TensorArg("steps_since_active", dtypes=CODES),
    ],
    kwargs={
        "decay": 0.9,
        "eps": 1e-5,
        "semantics": "active_only",
        "dead_threshold": None,
        "check_codes": True,
    },
    reference_kwargs={"decay": 0.9, "eps": 1e-5, "semantics": "active_only"},
    result=lambda inputs, _: tuple(inputs[k] for k in STATE),
    tol=1e-3,
)


@pytest.mark.parametrize("case", bad_input_params(QUANTIZE))
def test_quantize_bad_inputs(case, seed, device):
    check_bad_input(case, seed=seed, device=device)


@pytest.mark.parametrize("case", bad_input_params(EMA_STATISTICS))
def test_ema_statistics_bad_inputs(case, seed, device):
    check_bad_input(case, seed=seed, device=device)


@pytest.mark.parametrize("case", bad_input_params(EMA_UPDATE))
def test_ema_update_bad_inputs(case, seed, device):
    check_bad_input(case, seed=seed, device=device)


def _perplexity_reference(codes, num_codes):
    """float64 ``exp(entropy)`` of the histogram of the codes inside ``[0, num_codes)``."""
    flat = codes.reshape(-1).long()
    flat = flat[(flat >= 0) & (flat < num_codes)]
    counts = torch.zeros(num_codes, dtype=torch.float64)
    counts.index_add_(0, flat.cpu(), torch.ones(flat.numel(), dtype=torch.float64))
    p = counts / counts.sum().clamp_min(1)
    return torch.exp(-(p * torch.log(p.clamp_min(1e-12))).sum())


PERPLEXITY = OpSpec(
    "perplexity",
    perplexity,
    _perplexity_reference,
    lambda g: {"codes": randint(0, K, (L, B), generator=g), "num_codes": K},
    [TensorArg("codes", ranks=(0, 1, 2, 3), dtypes=CODES, index_range=(0, K))],
    tol=1e-5,
)


@pytest.mark.parametrize("case", bad_input_params(PERPLEXITY))
def test_perplexity_bad_inputs(case, seed, device):
    check_bad_input(case, seed=seed, device=device)


def test_perplexity_values():
    assert perplexity(torch.tensor([0, 1, 2, 3]), 4).item() == pytest.approx(4.0)
    assert perplexity(torch.tensor([2, 2, 2]), 4).item() == pytest.approx(1.0)
    # out-of-range codes take no part; no code at all gives 1
    assert perplexity(torch.tensor([0, 1, -1, 9]), 4).item() == pytest.approx(2.0)
    assert perplexity(torch.tensor([], dtype=torch.long), 4).item() == pytest.approx(1.0)
    with pytest.raises(TypeError, match="codes"):
        perplexity(torch.tensor([0.0, 1.0]), 4)
    with pytest.raises(ValueError, match="num_codes"):
        perplexity(torch.tensor([0, 1]), 0)
