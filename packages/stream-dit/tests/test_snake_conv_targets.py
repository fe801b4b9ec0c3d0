"""The decoder's snake_conv launches fit every supported GPU: the tiles each layer kind's plan
picks on a simulated sm_80 ... sm_120 card (fp32 and bf16, few rows and the many rows that take
the wide tile) compile for that card within its shared memory per block."""

import pytest
import torch

import stream_dit.ops.snake_conv.plan as plan
from stream_dit.ops.snake_conv import Head, Pointwise, Snake, prepare_snake_conv
from stream_dit.ops.snake_conv.op import SNAKE_CONV
from triton_dispatch.compile_check import recorded_launches, unavailable_reason
from triton_dispatch.declaration import Call
from triton_dispatch.device import simulated_device
from triton_dispatch.gpu_targets import TARGETS, check_launches

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))

#: (taps, C_in, C_out, phases, pointwise, head) of the Oobleck decoder's layer kinds at its widths
LAYERS = {
    "dilated-wide": (7, 1024, 1024, 1, False, False),
    "residual-unit": (7, 128, 128, 1, True, False),
    "last-unit-with-head": (7, 128, 128, 1, True, True),
    "transposed-stride-8": (2, 256, 128, 8, False, False),
}


def _layer(taps, cin, cout, phases, pointwise, head, dtype):
    ones = torch.ones
    snake = Snake(ones(cout), ones(cout))
    if pointwise:
        pointwise = Pointwise(snake, torch.zeros(cout, cout, dtype=dtype), ones(cout))
    if head:
        head = Head(torch.zeros(7, cout, 2, dtype=dtype), ones(2), 1, 3)
    return prepare_snake_conv(
        torch.zeros(taps, cin, phases * cout, dtype=dtype), ones(phases * cout),
        dilation=3 if taps == 7 else 1, padding=1 if phases > 1 else None, phases=phases,
        shift=phases // 2, out_snake=snake, pointwise=pointwise or None, head=head or None,
    )  # fmt: skip


def _launches(layer, many_rows: bool, monkeypatch) -> list:
    """The launches of the layer's GPU plan (the Triton backend's tiles) on 16 rows, recorded and
    not run; ``many_rows``: tiled as for 2**15 rows and more."""
    if many_rows:
        shipped = plan.launch_config

        def many(taps, phases, n_p, cin_p, whole_row, pointwise, rows, *rest):
            return shipped(taps, phases, n_p, cin_p, whole_row, pointwise, 1 << 15, *rest)

        monkeypatch.setattr(plan, "launch_config", many)
    x = torch.zeros(1, 16, layer.in_channels, dtype=layer.weight.dtype)
    names = [spec.name for spec in SNAKE_CONV.inputs]
    tensors = dict(zip(names, (x, layer.weight, *layer._tensors, None), strict=True))
    with recorded_launches(run=False) as calls:
        plan.snake_conv_plan(Call(tensors, layer._settings, x.device, "triton")).forward(
            *tensors.values()
        )
    monkeypatch.undo()
    return calls


def test_every_layer_kind_fits_every_target(monkeypatch):
    launches = {target: [] for target in TARGETS}
    for dtype in (torch.float32, torch.bfloat16):
        layers = [_layer(*case, dtype) for case in LAYERS.values()]
        for target in TARGETS:
            with simulated_device(target.facts()):
                for layer in layers:
                    for many_rows in (False, True):
                        launches[target] += _launches(layer, many_rows, monkeypatch)
    kernels = {name for calls in launches.values() for _, name, _ in calls}
    assert kernels == {"snake_conv_kernel", "tap_sum_kernel"}
    failures = check_launches(launches)
    assert not failures, "\n\n".join(failures)


def test_fp32_takes_the_default_tile_where_the_wide_one_does_not_fit():
    """fp32's wide tile compiles to 128 KB: the 99 KB cards take the 64-row tile, sm_90 keeps
    the wide one."""
    args = (7, 1, 1024, 1024, False, False, 1 << 15, False, False)
    small, large = TARGETS[-1].shared_memory_per_block, TARGETS[3].shared_memory_per_block
    assert plan.launch_config(*args, small, 4).block_m == 64
    assert plan.launch_config(*args, large, 4).block_m == 128
    assert plan.launch_config(*args, small, 2).block_m == 128
