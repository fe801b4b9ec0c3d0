"""A warm call of ``maxsim`` walks four files, each once, from the public function to the launch:
``dispatch.py`` (the public function), the declaration, ``plan.py`` (the bound plan) and
``triton_dispatch/launch.py`` (the launch)."""

import sys

import pytest
import torch

from late_interaction_kernels import maxsim
from late_interaction_kernels.ops.common import buffers
from triton_dispatch import interpreter_enabled


def _files_entered(fn) -> list[str]:
    """The package source files a call enters, in order, one entry per visit, up to the launch."""
    visits: list[str] = []
    done = False

    def tracer(frame, event, arg):
        nonlocal done
        path = frame.f_code.co_filename
        if done or event != "call" or "/src/" not in path:
            return None
        name = path.split("/src/")[-1]
        if not visits or visits[-1] != name:
            visits.append(name)
        done = name.endswith("triton_dispatch/launch.py") and frame.f_code.co_name == "__call__"
        return None

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return visits


@pytest.mark.skipif(not interpreter_enabled(), reason="traces the interpreter's launch route")
@pytest.mark.parametrize("grad", [False, True])
def test_warm_maxsim_call_enters_four_files_once_each(rng, grad, monkeypatch):
    monkeypatch.setenv("LIK_SUPPRESS_NORM_WARN", "1")
    monkeypatch.setattr(buffers, "POISON_OUTPUTS", False)  # the tests' poisoning: not a user's call
    Q = torch.nn.functional.normalize(torch.randn(2, 8, 32, generator=rng), dim=-1)
    D = torch.nn.functional.normalize(torch.randn(3, 16, 32, generator=rng), dim=-1)
    Q.requires_grad_(grad)
    for _ in range(2):
        maxsim(Q, D)
    visits = _files_entered(lambda: maxsim(Q, D))
    assert visits == [
        "late_interaction_kernels/ops/maxsim/dispatch.py",
        "triton_dispatch/declaration.py",
        "late_interaction_kernels/ops/maxsim/plan.py",
        "triton_dispatch/launch.py",
    ], visits
