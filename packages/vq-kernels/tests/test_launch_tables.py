"""The shipped launch-config tables against the kernels: every row names a kernel, its key fields
and a config of its space, and every config a GPU would launch compiles for sm_90."""

import pytest

from triton_dispatch import compile_check
from triton_dispatch.launch_configs import check_package_tables, shipped_tables
from vq_kernels import warmup

PACKAGE = "vq_kernels"


def test_tables_match_the_kernels():
    assert "sm90" in shipped_tables(PACKAGE)
    assert check_package_tables(PACKAGE) == []


@pytest.mark.skipif(
    compile_check.unavailable_reason() is not None, reason=str(compile_check.unavailable_reason())
)
def test_table_and_heuristic_configs_compile_for_sm90():
    warm = lambda: warmup(["16x8x4x2", "16x8x4x2:infer", "16x40x4:infer"], device="cpu")
    assert compile_check.check_table_configs(PACKAGE, warm) == []
