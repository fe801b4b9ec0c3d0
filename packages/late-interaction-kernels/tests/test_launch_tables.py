"""The shipped launch-config tables against the kernels: every row names a kernel, its key fields
and a config of its space, and the config each supported GPU launches for every tuned regime
compiles and fits that GPU's shared memory."""

import pytest
import torch

from late_interaction_kernels import warmup
from late_interaction_kernels.fp8 import maxsim_inference_fp8
from late_interaction_kernels.fused_head import maxsim_from_hidden
from late_interaction_kernels.ops.maxsim_residual import maxsim_residual
from late_interaction_kernels.ops.maxsim_residual.reference import pack_buckets
from triton_dispatch import compile_check, target_check
from triton_dispatch.launch_configs import check_package_tables, shipped_tables

PACKAGE = "late_interaction_kernels"
compiles = pytest.mark.skipif(
    compile_check.unavailable_reason() is not None, reason=str(compile_check.unavailable_reason())
)


def test_tables_match_the_kernels():
    assert set(shipped_tables(PACKAGE)) == {"h100", "h200"}
    assert check_package_tables(PACKAGE) == []


def _warm() -> None:
    """One launch of every tuned kernel under the interpreter: a MaxSim step of each method and
    layout, top-k, the fused projection head, residual-compressed documents, and FP8 scoring on
    fp16 stand-ins (the check lays each table row's dtypes over them)."""
    shapes = ["2x3x5x7x16", "2x2x5x7x16:mask,lowmem", "2x2x40x7x16:pairs", "1x4x5x9x16:topk",
              "4x4x5x9x16:unified", "6x2x50x7x16:lowmem"]  # fmt: skip
    warmup(shapes, device="cpu", dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    Q, D = torch.randn(2, 5, 16, generator=g), torch.randn(3, 9, 16, generator=g)
    maxsim_inference_fp8(Q.half(), D.half(), scale_Q=torch.tensor(0.5), scale_D=torch.tensor(2.0),
                         backend="interpret")  # fmt: skip
    H, W = torch.randn(3, 9, 20, generator=g), torch.randn(16, 20, generator=g)
    with torch.no_grad():
        maxsim_from_hidden(Q, H, W, torch.randn(16, generator=g), fused=True)
    doclens = torch.tensor([3, 6])
    buckets = torch.randint(0, 4, (9, 16), generator=g)
    parts = (torch.randn(4, 16, generator=g), torch.randint(0, 4, (9,), generator=g),
             pack_buckets(buckets, 2), torch.randn(4, generator=g), doclens)  # fmt: skip
    maxsim_residual(Q.requires_grad_(), *parts, nbits=2).sum().backward()


@compiles
def test_every_target_launches_configs_that_fit_it():
    """The config each of sm_80, sm_86, sm_89, sm_90, sm_100 and sm_120 launches first for every
    regime of the tables and the warm-up (compiled up to LLVM IR, once per mma group): none needs
    more shared memory than the target has."""
    failures, measured = target_check.check_targets(PACKAGE, _warm)
    assert not failures, "\n\n".join(failures)
    assert {plan.kernel for plan, _ in measured} >= {"fp8_maxsim_kernel", "maxsim_fwd_kernel"}


@pytest.mark.slow
@pytest.mark.skipif(not target_check.exhaustive_requested(), reason=target_check.EXHAUSTIVE_SKIP)
def test_every_config_compiles_for_every_target_and_mma_groups_agree():
    """Every config the runtime guard may fall back to, compiled whole for each target on its
    own; targets of one mma group allocate the same shared memory (what the fast check relies
    on)."""
    failures, _ = target_check.check_targets(PACKAGE, _warm, exhaustive=True)
    assert not failures, "\n\n".join(failures)
