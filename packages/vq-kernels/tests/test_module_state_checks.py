"""load_state_dict of the quantizers refuses state of the wrong shape or dtype by name."""

import pytest
import torch

from vq_kernels import ResidualVQ, VectorQuantizer


def _state(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("ema", [True, False])
def test_round_trip_still_loads(ema):
    src, dst = ResidualVQ(4, 8, 2, ema=ema), ResidualVQ(4, 8, 2, ema=ema)
    dst.load_state_dict(src.state_dict())
    assert torch.equal(dst.codebook, src.codebook)
    # a float64 codebook of the right shape is a floating dtype: cast, as torch does
    state = _state(src)
    state["codebook"] = state["codebook"].double()
    dst.load_state_dict(state)
    assert dst.codebook.dtype == torch.float32


@pytest.mark.parametrize(
    "key, value, error, match",
    [
        (
            "codebook",
            torch.zeros(1, 8, 4),
            ValueError,
            r"'codebook'\] must have shape \(L, K, D\) = \(2, 8, 4\)",
        ),
        ("codebook", torch.zeros(2, 16, 4), ValueError, r"codebook_size=8.*got \(2, 16, 4\)"),
        ("codebook", torch.zeros(2, 8, 5), ValueError, r"dim=4"),
        ("embed_sum", torch.zeros(2, 8), ValueError, r"'embed_sum'\] must have shape"),
        (
            "cluster_size",
            torch.zeros(2, 9),
            ValueError,
            r"'cluster_size'\] must have shape \(L, K\)",
        ),
        (
            "steps_since_active",
            torch.zeros(2, 8, 1, dtype=torch.int32),
            ValueError,
            "steps_since_active",
        ),
        ("initialized", torch.tensor([True]), ValueError, r"a scalar \(\)"),
        (
            "codebook",
            torch.zeros(2, 8, 4, dtype=torch.int64),
            TypeError,
            "floating dtype, got torch.int64",
        ),
        ("cluster_size", torch.ones(2, 8, dtype=torch.bool), TypeError, "floating dtype"),
        ("steps_since_active", torch.zeros(2, 8), TypeError, "integer dtype, got torch.float32"),
        ("initialized", torch.tensor(1.0), TypeError, "bool dtype"),
        ("codebook", torch.zeros(2, 8, 4, dtype=torch.complex64), TypeError, "complex64"),
        ("codebook", [[0.0]], TypeError, "must be a tensor"),
        ("embed_sum", torch.full((2, 8, 4), float("nan")), ValueError, "non-finite"),
    ],
)
def test_wrong_state_is_refused_by_name(key, value, error, match):
    m = ResidualVQ(4, 8, 2)
    before = _state(m)
    state = _state(m)
    state[key] = value
    with pytest.raises(error, match=match):
        m.load_state_dict(state)
    for k, v in m.state_dict().items():  # nothing was half-loaded
        assert torch.equal(v, before[k]), k


def test_vector_quantizer_and_nested_prefixes():
    outer = torch.nn.Sequential(VectorQuantizer(4, 8))
    state = _state(outer)
    state["0.codebook"] = torch.zeros(2, 8, 4)
    with pytest.raises(
        ValueError, match=r"VectorQuantizer: state_dict\['0.codebook'\].*num_levels=1"
    ):
        outer.load_state_dict(state)
    # a learned codebook (a Parameter) is checked the same way
    learned = VectorQuantizer(4, 8, ema=False)
    state = _state(learned)
    state["codebook"] = torch.zeros(1, 8, 3)
    with pytest.raises(ValueError, match="dim=4"):
        learned.load_state_dict(state)
