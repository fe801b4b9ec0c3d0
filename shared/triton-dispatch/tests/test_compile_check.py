import sys
from pathlib import Path

import pytest
import torch

from triton_dispatch.compile_check import compile_recorded, recorded_launches, unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))


@pytest.fixture
def kernels(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    import compile_check_kernels

    yield compile_check_kernels
    sys.modules.pop("compile_check_kernels", None)


def test_a_kernel_the_interpreter_runs_but_the_compiler_rejects_is_reported(kernels):
    x, y = torch.randn(32), torch.empty(64)
    with recorded_launches() as calls:
        kernels.good_kernel[(2,)](x, y, 32, BLOCK=16)
        kernels.branch_shape_kernel[(2,)](x, y, 32, BLOCK=16)
        kernels.good_kernel[(2,)](x, y, 32, BLOCK=16)  # a repeat is compiled once
    assert [name for _, name, _ in calls] == ["good_kernel", "branch_shape_kernel", "good_kernel"]
    assert calls[0][2] == {
        "X": ["ptr", "fp32"], "Y": ["ptr", "fp32"], "n": ["int", 32], "BLOCK": ["int", 16]
    }  # fmt: skip
    failures = compile_recorded(calls)
    assert len(failures) == 1 and "branch_shape_kernel" in failures[0], failures


def test_nothing_recorded_compiles_nothing():
    assert compile_recorded([]) == []
