"""The supported targets and the CPU compile that measures a launch's shared memory on each."""

import re
import sys
from pathlib import Path

import pytest
import torch

from triton_dispatch.cards import as_card
from triton_dispatch.compile_check import recorded_launches, unavailable_reason
from triton_dispatch.device import DeviceFacts, device_facts, simulated_device
from triton_dispatch.gpu_targets import (
    TARGETS,
    check_launches,
    compile_for_targets,
    describe_launch,
    runs_on,
    target_of,
)
from triton_dispatch.launch_configs import family_capability, parse_table
from triton_dispatch.table_rows import tables_by_nearness

compiles = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))


@pytest.fixture
def kernels(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    import target_kernels

    yield target_kernels
    sys.modules.pop("target_kernels", None)


def test_the_targets_and_their_limits():
    assert [t.name for t in TARGETS] == ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"]
    limits = {t.name: t.shared_memory_per_block // 1024 for t in TARGETS}
    assert limits == {"sm_80": 163, "sm_86": 99, "sm_89": 99, "sm_90": 227, "sm_100": 227,
                      "sm_120": 99}  # fmt: skip
    assert target_of((12, 0)).cards.startswith("RTX 5090") and target_of((7, 5)) is None
    facts = target_of((8, 9)).facts()
    assert facts.capability == (8, 9) and facts.shared_memory_per_block == 99 * 1024
    fp8 = {"Q": ["ptr", "fp8e4nv"], "K": ["int", 4]}
    assert [t.name for t in TARGETS if runs_on(fp8, t)] == ["sm_89", "sm_90", "sm_100", "sm_120"]


def test_a_simulated_device_answers_for_every_device():
    card = DeviceFacts("RTX 5090", (12, 0), 170, 99 * 1024, 0)
    with simulated_device(card):
        assert device_facts("cpu") is card and device_facts(None) is card
    assert device_facts("cpu").name == "cpu"


def test_older_family_tables_are_read_nearest_card_first():
    """Tables named by family (no card) stand for their family's first known card: an H100 for
    sm90, an A100 for sm80, a B200 for sm100."""
    tables = [parse_table({"kernels": {"k": [{}]}}, f) for f in ("sm90", "sm100", "sm80")]
    order = lambda capability: [t.name for t in tables_by_nearness(tables, as_card(capability))]
    assert order((9, 0)) == ["sm90", "sm80", "sm100"]  # its own, then within its shared memory
    assert order((12, 0)) == ["sm80", "sm90", "sm100"]  # none of its own: nearest by bandwidth
    assert order((8, 6)) == ["sm80", "sm90", "sm100"]  # the same major version first
    assert family_capability("sm120") == (12, 0) and family_capability("cpu") is None


def test_describe_launch_names_what_is_missing(kernels):
    module, name, described = describe_launch(kernels.tile_dot_kernel, kernels.launch(64))
    assert (module, name) == ("target_kernels", "tile_dot_kernel")
    assert described["A"] == ["ptr", "fp16"] and described["BLOCK_K"] == ["int", 64]
    without_k = {k: v for k, v in kernels.launch(64).items() if k != "K"}
    with pytest.raises(ValueError, match=r"no value for \['K'\]"):
        describe_launch(kernels.tile_dot_kernel, without_k)


@compiles
def test_every_target_compiles_and_reports_what_fits(kernels):
    """Triton 3.6 compiles for each target on this CPU, ptxas included (sm_100a and sm_120a
    through its ptxas-blackwell); a 128x128 tile with 128-wide K steps over three stages fits
    the 163 KB and 227 KB cards, not the 99 KB ones."""
    options = {"num_warps": 8, "num_stages": 3}
    launches = [
        (*describe_launch(kernels.tile_dot_kernel, kernels.launch(k)), options) for k in (64, 128)
    ]
    uses = compile_for_targets(launches)
    assert [u.error for u in uses] == [None] * 12, [u.error for u in uses if u.error]
    fits = {(u.described["BLOCK_K"][1], u.target.name): u.fits for u in uses}
    assert all(fits[(64, t.name)] for t in TARGETS)
    assert [t.name for t in TARGETS if not fits[(128, t.name)]] == ["sm_86", "sm_89", "sm_120"]
    shared = {(u.described["BLOCK_K"][1], u.target.capability): u.shared for u in uses}
    assert shared[(128, 90)] > shared[(128, 80)] == shared[(128, 86)] == shared[(128, 120)]
    assert "does NOT fit (101376 per block)" in str(next(u for u in uses if not u.fits))


@compiles
def test_check_launches_compiles_once_per_mma_group_and_names_what_does_not_fit(kernels):
    options = {"num_warps": 8, "num_stages": 3}
    big = (*describe_launch(kernels.tile_dot_kernel, kernels.launch(128)), options)
    failures = check_launches({t: [big] for t in TARGETS})
    named = sorted(re.search(r" on (sm_\d+): ", f).group(1) for f in failures)
    assert named == ["sm_120", "sm_86", "sm_89"], failures
    with recorded_launches(run=False) as calls:  # a launch recorded, not run, with its options
        a, b, c = torch.zeros(128, 128).half(), torch.zeros(128, 128).half(), torch.zeros(128, 128)
        kernels.tile_dot_kernel[(1,)](a, b, c, 128, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128,
                                      num_warps=8, num_stages=3)  # fmt: skip
    assert calls[0].options == {"num_warps": 8, "num_stages": 3} and not c.any()
