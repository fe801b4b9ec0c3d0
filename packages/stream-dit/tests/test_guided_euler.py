import pytest
import torch

from stream_dit.ops.guided_euler import guided_euler_, guided_euler_reference_
from stream_dit.ops.guided_euler.op import GUIDED_EULER
from stream_dit.ops.guided_euler.reference import guided_euler_rows_reference_
from triton_dispatch.compile_check import compile_recorded, recorded_launches, unavailable_reason
from triton_dispatch.declaration import Call
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


def _tables(args, channels, device):
    slot, pos, neg, lengths, guidance, dt = args
    rows = torch.tensor([slot, pos, neg, [n * channels for n in lengths]], device=device)
    return rows, torch.tensor([guidance, dt], dtype=torch.float32, device=device)


@pytest.mark.parametrize("vdtype", [torch.float32, torch.float16, torch.bfloat16])
def test_table_reference_is_the_spec_bit_for_bit(rng, vdtype):
    """The declaration's reference (device tables, no host read) against the loop spec."""
    state, vel, args = _case(rng, "cpu", vdtype)
    expected = guided_euler_reference_(state.clone(), vel, *args)
    out = state.clone()
    assert guided_euler_rows_reference_(out, vel, *_tables(args, 16, "cpu")) == ()
    assert torch.equal(out, expected)
    # and through the public function's reference route
    assert torch.equal(guided_euler_(state.clone(), vel, *args, backend="torch"), expected)


def test_repeat_calls_hit_the_plan_and_reuse_the_row_table(rng, device):
    state, vel, args = _case(rng, device)
    GUIDED_EULER.plans.clear()
    cache: dict = {}
    guided_euler_(state, vel, *args, rows_cache=cache)
    (rows,) = cache.values()
    other_dt = [-0.5, -0.25, -0.125]  # new per-row scalars: the same plan, the same row table
    expected = guided_euler_reference_(
        state.double().cpu(), vel.double().cpu(), *args[:5], other_dt
    )
    out = guided_euler_(state, vel, *args[:5], other_dt, rows_cache=cache)
    assert_close(out, expected, dtype=torch.float32)
    assert (GUIDED_EULER.plans.hits, GUIDED_EULER.plans.misses) == (1, 1)
    assert next(iter(cache.values())) is rows and len(cache) == 1


def test_compiled_call_traces_the_custom_op_and_writes_the_state(rng, device):
    state, vel, args = _case(rng, device)
    expected = guided_euler_(state.clone(), vel, *args)
    compiled = torch.compile(
        lambda s, v: guided_euler_(s, v, *args), fullgraph=True, backend="aot_eager"
    )
    out = state.clone()
    assert compiled(out, vel) is out
    assert torch.equal(out, expected)


@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_the_gpu_launch_compiles_for_sm90(rng):
    """The launch a CUDA plan binds (GPU block size, bf16 velocity) compiles for an sm_90 GPU."""
    from stream_dit.ops.guided_euler.forward import guided_euler_plan

    state, vel, args = _case(rng, "cpu", torch.bfloat16)
    rows, params = _tables(args, 16, "cpu")
    tensors = dict(state=state, velocity=vel, rows=rows, params=params)
    with recorded_launches() as calls:
        guided_euler_plan(Call(tensors, {}, state.device, "triton")).forward(*tensors.values())
    assert [(name, meta["BLOCK"]) for _, name, meta in calls] == [
        ("_guided_euler_kernel", ["int", 1024])
    ]
    assert compile_recorded(calls) == []
