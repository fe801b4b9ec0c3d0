"""Every kernel of a ResidualVQ training step compiles for an sm_90 GPU (the interpreter accepts
code the GPU compiler rejects; this runs on a CPU-only machine)."""

import pytest
import torch

from triton_dispatch.compile_check import compile_recorded, recorded_launches, unavailable_reason
from vq_kernels import ResidualVQ

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))


@pytest.fixture
def gpu_block_sizes(monkeypatch):
    """The fused residual search picks its GPU tile and precision (the interpreter's are
    smaller, and some compile errors show only at the GPU's sizes)."""
    from triton_dispatch.launch import clear_plan_caches
    from vq_kernels.ops.residual_quantize import kernels

    monkeypatch.setattr(kernels, "interpreter_enabled", lambda: False)
    clear_plan_caches()
    yield
    clear_plan_caches()


@pytest.mark.parametrize("metric", ["l2", "cosine"])
def test_training_step_kernels_compile_for_sm90(metric, gpu_block_sizes):
    torch.manual_seed(0)
    module = ResidualVQ(16, 32, 3, metric=metric, dead_threshold=1)
    x = torch.randn(70, 16, requires_grad=True)
    with recorded_launches() as calls:
        out = module(x)
        (out.quantized.square().mean() + out.loss).backward()
    names = {name for _, name, _ in calls}
    assert {"residual_quantize_kernel", "residual_grad_kernel"} <= names, names
    failures = compile_recorded(calls)
    assert not failures, "\n\n".join(failures)
