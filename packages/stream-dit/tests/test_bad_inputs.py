"""Every public op of stream-dit through the shared bad-input kit (tiny shapes)."""

import pytest
import torch

from stream_dit.ops.guided_euler import guided_euler_, guided_euler_reference_
from triton_dispatch.testing import OpSpec, TensorArg, bad_input_params, check_bad_input, randn


def _guided_euler_inputs(gen):
    return {
        "state": randn((4, 8, 4), generator=gen),
        "velocity": randn((6, 8, 4), generator=gen),
        "slot_rows": [0, 3, 1],
        "pos_rows": [0, 1, 2],
        "neg_rows": [3, 4, 5],
        "lengths": [8, 5, 1],
        "guidance": [2.5, 1.0, 7.0],
        "dt": [-0.125, -0.3, -1.0],
    }


GUIDED_EULER = OpSpec(
    "guided_euler_",
    guided_euler_,
    guided_euler_reference_,
    _guided_euler_inputs,
    [
        TensorArg("state"),
        TensorArg("velocity", dtypes=(torch.float32, torch.float16, torch.bfloat16, torch.float64)),
    ],
)


@pytest.mark.parametrize("case", bad_input_params(GUIDED_EULER))
def test_guided_euler_bad_inputs(case, seed, device):
    check_bad_input(case, seed=seed, device=device)
