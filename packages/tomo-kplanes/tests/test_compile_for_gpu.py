"""Every kernel of a fused training step compiles for an sm_90 GPU (the interpreter accepts code
the GPU compiler rejects; this runs on a CPU-only machine)."""

import pytest
import torch

from tomo_kplanes.geometry import TiltGeometry
from tomo_kplanes.model import KPlanesTilted
from tomo_kplanes.objective import (
    DensityConstraints,
    LossWeights,
    ReconstructionContext,
    TomographyObject,
    reconstruction_loss,
)
from triton_dispatch.compile_check import compile_recorded, recorded_launches, unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))


@pytest.fixture
def gpu_block_sizes(monkeypatch):
    """The launch plans pick their GPU block sizes (the interpreter's are smaller, and a shape
    clash between two branches shows only with the GPU's)."""
    from tomo_kplanes.ops.plane_tv import kernels as plane_tv_kernels
    from tomo_kplanes.ops.ray_loss import kernels as ray_loss_kernels
    from triton_dispatch.launch import clear_plan_caches

    for module in (plane_tv_kernels, ray_loss_kernels):
        monkeypatch.setattr(module, "interpreter_enabled", lambda: False)
    clear_plan_caches()
    yield
    clear_plan_caches()


@pytest.mark.parametrize("fold_taps", [True, False])
def test_training_step_kernels_compile_for_sm90(fold_taps, gpu_block_sizes):
    g = torch.Generator().manual_seed(0)
    field = KPlanesTilted(8, channels=3, rotations=2, rotation_init_std=0.2, generator=g)
    obj = TomographyObject(field, DensityConstraints(positivity=True, shrinkage=0.01))
    geo = TiltGeometry(torch.tensor([-50.0, 0.0, 35.0]), (6, 5))
    points, steps = geo.rays(torch.arange(12), 7)
    ctx = ReconstructionContext(tv_tap_points=obj.sample_tv_tap_coords(20, generator=g))
    weights = LossWeights(volume_tv=0.1, plane_tv=0.01)
    with recorded_launches() as calls:
        loss, _ = reconstruction_loss(
            obj, points, steps, torch.rand(12, generator=g), weights, ctx, fold_taps=fold_taps
        )
        loss.backward()
    names = {name for _, name, _ in calls}
    assert len(names) >= 3, names  # the field, the loss and the plane prior ran as kernels
    failures = compile_recorded(calls)
    assert not failures, "\n\n".join(failures)
