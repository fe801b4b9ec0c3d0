import pytest
import torch

from stream_dit.ops.guided_euler import guided_euler_, guided_euler_reference_
from triton_dispatch.testing import assert_close


def _case(rng, device, vdtype=torch.float32):
    state = torch.randn(4, 40, 16, generator=rng).to(device)
    vel = torch.randn(6, 48, 16, generator=rng).to(device=device, dtype=vdtype)
    args = ([0, 3, 1], [0, 1, 2], [3, 4, 5], [40, 17, 1], [2.5, 1.0, 7.0], [-0.125, -0.3, -1.0])
    return state, vel, args


@pytest.mark.parametrize("vdtype", [torch.float32, torch.float16])
def test_matches_float64_reference(rng, device, vdtype):
    state, vel, args = _case(rng, device, vdtype)
    expected = guided_euler_reference_(state.double().cpu(), vel.double().cpu(), *args)
    out = guided_euler_(state.clone(), vel, *args)
    assert_close(out, expected, dtype=torch.float32)
    # untouched rows and frames stay bit-equal
    assert torch.equal(out[2], state[2])
    assert torch.equal(out[3, 17:], state[3, 17:])


def test_reads_only_the_rows_it_names(rng, device):
    state, vel, args = _case(rng, device)
    vel[:, 40:] = float("nan")  # past every length
    out = guided_euler_(state.clone(), vel, *args)
    assert torch.isfinite(out).all()


def test_empty_rows_is_a_no_op(rng, device):
    state, vel, _ = _case(rng, device)
    out = guided_euler_(state.clone(), vel, [], [], [], [], [], [])
    assert torch.equal(out, state)


def test_bad_inputs(rng):
    state, vel, args = _case(rng, "cpu")
    with pytest.raises(ValueError, match="one entry per row"):
        guided_euler_(state, vel, [0], [0, 1], [1], [1], [1.0], [0.1])
    with pytest.raises(ValueError, match="pos_rows"):
        guided_euler_(state, vel, [0], [9], [1], [1], [1.0], [0.1])
    with pytest.raises(ValueError, match="lengths"):
        guided_euler_(state, vel, [0], [0], [1], [41], [1.0], [0.1])
    with pytest.raises(TypeError, match="float32"):
        guided_euler_(state.double(), vel, *args)
    with pytest.raises(ValueError, match="finite"):
        guided_euler_(state, vel, [0], [0], [1], [3], [float("nan")], [0.1])
    with pytest.raises(ValueError, match="repeat"):
        guided_euler_(state, vel, [0, 0], [0, 1], [2, 3], [3, 3], [1.0, 1.0], [0.1, 0.1])
    with pytest.raises(ValueError, match="channel"):
        guided_euler_(state, vel[..., :8].contiguous(), *args)
