"""The shipped launch-config tables against the kernels: every row names a kernel, its key fields
and a config of its space, and every config a GPU would launch compiles for sm_90."""

import pytest
import torch

from late_interaction_kernels import warmup
from triton_dispatch import compile_check
from triton_dispatch.launch_configs import check_package_tables, shipped_tables

PACKAGE = "late_interaction_kernels"
# Kernels of other ops, whose configs the sm_90 compile tests of those ops build
# (compile_for_hopper.py, test_topk_fp8.py): float8 operands do not run in the interpreter, and
# the fused-head and residual ops are not part of a MaxSim step's warm-up.
NOT_IN_WARMUP = {
    "fp8_maxsim_kernel": "float8 operands do not run under the interpreter",
    "from_hidden_fwd_kernel": "maxsim_from_hidden is not part of warmup()",
    "residual_fwd_kernel": "maxsim_residual is not part of warmup()",
    "residual_grad_q_kernel": "maxsim_residual is not part of warmup()",
}


def test_tables_match_the_kernels():
    assert "sm90" in shipped_tables(PACKAGE)
    assert check_package_tables(PACKAGE) == []


@pytest.mark.skipif(
    compile_check.unavailable_reason() is not None, reason=str(compile_check.unavailable_reason())
)
def test_table_and_heuristic_configs_compile_for_sm90():
    shapes = ["2x3x5x7x16", "2x2x5x7x16:mask,lowmem", "2x2x40x7x16:pairs", "1x4x5x9x16:topk",
              "4x4x5x9x16:unified", "6x2x50x7x16:lowmem"]  # fmt: skip
    warm = lambda: warmup(shapes, device="cpu", dtype=torch.float32)
    assert compile_check.check_table_configs(PACKAGE, warm, skip=NOT_IN_WARMUP) == []
