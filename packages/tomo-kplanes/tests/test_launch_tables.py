"""The shipped launch-config tables against the kernels: every row names a kernel, its key fields
and a config of its space, and the config each supported GPU launches for every tuned regime
compiles and fits that GPU's shared memory."""

import pytest

from tomo_kplanes import warmup
from triton_dispatch import compile_check, target_check
from triton_dispatch.launch_configs import check_package_tables, shipped_tables

PACKAGE = "tomo_kplanes"


def test_tables_match_the_kernels():
    assert set(shipped_tables(PACKAGE)) == {"h100", "h200"}  # each made on its card
    assert check_package_tables(PACKAGE) == []


def _warm() -> None:
    """Every tuned kernel once under the interpreter (forward, backward, learned rotations)."""
    warmup(["8x4x2", "8x4x1:plain"], device="cpu", rays=16, samples=8, tv_points=16)


@pytest.mark.skipif(
    compile_check.unavailable_reason() is not None, reason=str(compile_check.unavailable_reason())
)
def test_every_target_launches_configs_that_fit_it():
    """The config each supported GPU (sm_80 to sm_120) launches first for every regime of the
    tables and the warm-up compiles and needs no more shared memory than that GPU has."""
    failures, _ = target_check.check_targets(PACKAGE, _warm)
    assert not failures, "\n\n".join(failures)


@pytest.mark.slow
@pytest.mark.skipif(not target_check.exhaustive_requested(), reason=target_check.EXHAUSTIVE_SKIP)
def test_every_config_compiles_for_every_target_and_mma_groups_agree():
    """Every config the runtime guard may fall back to, compiled whole for each target on its
    own; targets of one mma group allocate the same shared memory (what the fast check relies
    on)."""
    failures, _ = target_check.check_targets(PACKAGE, _warm, exhaustive=True)
    assert not failures, "\n\n".join(failures)
