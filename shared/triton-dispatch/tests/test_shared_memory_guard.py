"""The runtime guard: no config whose compiled kernel needs more shared memory than the device
has is launched. On CPU the device is simulated (:func:`simulated_device`) and each compile
returns the shared memory Triton allocates for the config on that card, measured by compiling
for it here; the ``gpu`` tests run the guard on a real GPU."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import triton_dispatch.launch_configs as lc
import triton_dispatch.tuned_kernel as tk
from triton_dispatch import autotune, set_autotune
from triton_dispatch.bounded_tune import BOUNDED_TUNE_ENV_VAR
from triton_dispatch.compile_check import unavailable_reason
from triton_dispatch.device import simulated_device
from triton_dispatch.gpu_targets import compile_for_targets, describe_launch, target_of
from triton_dispatch.shared_memory import (
    SharedMemoryError,
    compiled_shared_memory,
    fitting_options,
)

RTX_5090 = target_of((12, 0))
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def kernels(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    import target_kernels

    yield target_kernels
    sys.modules.pop("target_kernels", None)


def _as_on_a_gpu(monkeypatch, kernels, shared_of, *, default=None):
    """The tuned tile kernel built as on a GPU (its whole space): launches are recorded, a
    compile (``warmup=True``) returns a kernel of ``shared_of[(BLOCK_K, num_stages)]`` bytes.
    The first-call short tune is off (it would time on the GPU; test_bounded_tune fakes it)."""
    monkeypatch.setattr(tk, "interpreter_enabled", lambda: False)
    monkeypatch.setenv(BOUNDED_TUNE_ENV_VAR, "0")
    space = kernels.SPACE
    kernel = autotune(space, key=["K"], default=default or space[4])(kernels.tile_dot_kernel)
    launched: list[dict] = []

    def run(*args, warmup=False, **kw):
        if warmup:
            shared = shared_of[(kw["BLOCK_K"], kw["num_stages"])]
            return SimpleNamespace(metadata=SimpleNamespace(shared=shared))
        launched.append(kw)

    monkeypatch.setattr(kernel.fn, "run", run, raising=False)
    return kernel, launched


def _launch(kernel, k=1024):
    a, b, c = torch.zeros(128, k).half(), torch.zeros(k, 128).half(), torch.zeros(128, 128)
    kernel[(1,)](a, b, c, k, BLOCK_M=128, BLOCK_N=128)


def _h100_table(monkeypatch, *configs):
    rows = [{"key": {"K": 1024, "A": "torch.float16", "B": "torch.float16", "C": "torch.float32"},
             "config": lc.config_to_json(c), "card": H100} for c in configs]  # fmt: skip
    table = lc.parse_table({"card": H100, "family": "sm90", "kernels": {"tile_dot_kernel": rows}},
                           "h100")  # fmt: skip
    monkeypatch.setattr(lc, "package_tables", lambda pkg: [table] * (pkg == "target_kernels"))


@pytest.fixture(scope="module")
def on_rtx_5090():
    """``{(BLOCK_K, num_stages): bytes}`` of the tile kernel's space compiled for sm_120."""
    if unavailable_reason() is not None:
        pytest.skip(unavailable_reason())
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        import target_kernels as kernels

        launches = [
            (*describe_launch(kernels.tile_dot_kernel, kernels.launch(c.kwargs["BLOCK_K"])),
             {"num_warps": c.num_warps, "num_stages": c.num_stages})
            for c in kernels.SPACE
        ]  # fmt: skip
        uses = compile_for_targets(launches, [RTX_5090], through="llir")
    finally:
        sys.path.remove(str(Path(__file__).parent))
        sys.modules.pop("target_kernels", None)
    return {(u.described["BLOCK_K"][1], u.options["num_stages"]): u.shared for u in uses}


def test_a_card_without_a_table_gets_a_config_that_fits_it(monkeypatch, kernels, on_rtx_5090):
    """An RTX 5090 (sm_120, 99 KB per block) has no table: it reads the H100's, whose row for
    this regime (128-wide K steps, 3 stages: 192 KB on an H100) needs 128 KB there. The guard
    passes it over and launches the next config, which fits (the short tune off; with it, see
    test_bounded_tune)."""
    limit = RTX_5090.shared_memory_per_block
    big = next(c for c in kernels.SPACE if c.kwargs["BLOCK_K"] == 128 and c.num_stages == 3)
    assert on_rtx_5090[(128, 3)] > limit >= on_rtx_5090[(64, 3)]  # measured, not assumed
    _h100_table(monkeypatch, big)
    kernel, launched = _as_on_a_gpu(monkeypatch, kernels, on_rtx_5090)
    assert kernel.select({"K": 1024, "A": torch.float16, "B": torch.float16,
                          "C": torch.float32}, (12, 0))[1] == "borrowed"  # fmt: skip
    with simulated_device(RTX_5090.facts()):
        _launch(kernel)
    (key,) = kernel.sources
    assert [(c.kwargs, c.num_stages, n) for c, n in kernel.too_large[key]] == [
        ({"BLOCK_K": 128}, 3, on_rtx_5090[(128, 3)])
    ]
    chosen = (launched[0]["BLOCK_K"], launched[0]["num_stages"])
    assert on_rtx_5090[chosen] <= limit and kernel.sources[key] == "heuristic"
    # on an H100 the same row fits and is taken as it is
    kernel, launched = _as_on_a_gpu(monkeypatch, kernels, {k: 0 for k in on_rtx_5090})
    with simulated_device(target_of((9, 0)).facts()):
        _launch(kernel)
    assert (launched[0]["BLOCK_K"], launched[0]["num_stages"]) == (128, 3)
    assert list(kernel.sources.values()) == ["table"]


def test_autotuning_benchmarks_only_the_configs_that_fit(monkeypatch, kernels, on_rtx_5090):
    limit = RTX_5090.shared_memory_per_block
    kernel, launched = _as_on_a_gpu(monkeypatch, kernels, on_rtx_5090)
    timed = []
    monkeypatch.setattr(kernel, "_bench", lambda *a, config, **kw: timed.append(config) or [1.0])
    monkeypatch.setenv("TRITON_DISPATCH_TUNING_CACHE", "0")
    set_autotune(True, "target_kernels")
    try:
        with simulated_device(RTX_5090.facts()):
            _launch(kernel)
    finally:
        set_autotune(None, "target_kernels")
    fitting = [k for k, n in on_rtx_5090.items() if n <= limit]
    assert 0 < len(timed) == len(fitting) < len(kernels.SPACE)
    assert all(on_rtx_5090[(c.kwargs["BLOCK_K"], c.num_stages)] <= limit for c in timed)
    assert len(launched) == 1


def test_nothing_fits_is_a_clear_error(monkeypatch, kernels):
    kernel, launched = _as_on_a_gpu(monkeypatch, kernels, {k: 300_000 for k in
                                                           [(b, s) for b in (32, 64, 128)
                                                            for s in (2, 3, 4)]})  # fmt: skip
    with simulated_device(RTX_5090.facts()), pytest.raises(SharedMemoryError) as error:
        _launch(kernel)
    message = str(error.value)
    assert message.startswith("tile_dot_kernel: no launch config fits the 101376 bytes")
    assert "RTX 5090 (simulated sm_120)" in message and "needs 300000 bytes" in message
    assert message.count("needs") == len(kernels.SPACE) and not launched


def test_a_chosen_launch_pipelines_less_deeply_until_it_fits():
    """The guard of launches whose options the code chose: fewer stages, same blocks."""
    facts = RTX_5090.facts()
    compiled = []

    def compile_only(options):
        compiled.append(options["num_stages"])
        return SimpleNamespace(metadata=SimpleNamespace(shared=40_000 * options["num_stages"]))

    options = {"num_warps": 8, "num_stages": 4}
    assert fitting_options(compile_only, options, facts, "k") == {"num_warps": 8, "num_stages": 2}
    assert compiled == [4, 3, 2]
    compiled.clear()
    assert fitting_options(compile_only, {"num_stages": 1}, facts, "k") == {"num_stages": 1}
    assert compiled == [1]  # what fits costs one compile, the one its launch reuses
    with pytest.raises(SharedMemoryError, match=r"k: no launch config fits .* needs 240000"):
        fitting_options(lambda o: SimpleNamespace(metadata=SimpleNamespace(shared=240_000)),
                        options, facts, "k")  # fmt: skip


@pytest.mark.gpu
def test_on_a_gpu_a_small_cards_limit_is_kept(kernels):
    """A real GPU, simulated as a 99 KB card: a KernelLaunch whose stages do not fit pipelines
    less deeply, and a tuned kernel passes over its oversized default; both launch kernels
    within the limit and compute the right tile."""
    from triton_dispatch.launch import KernelLaunch

    limit = RTX_5090.shared_memory_per_block
    a = torch.randn(128, 1024, device="cuda").half()
    b = torch.randn(1024, 128, device="cuda").half()
    want, c = a.float() @ b.float(), torch.empty(128, 128, device="cuda")
    blocks = dict(BLOCK_M=128, BLOCK_N=128)

    def shared(**meta) -> int:
        compiled = kernels.tile_dot_kernel.run(a, b, c, 1024, grid=(1,), warmup=True, **meta)
        return compiled_shared_memory(compiled)

    with simulated_device(RTX_5090.facts()):
        bound = dict(K=1024, BLOCK_K=128, **blocks)
        options = {"num_warps": 8, "num_stages": 4}
        launch = KernelLaunch(kernels.tile_dot_kernel, (1,), bound, device=a.device, options=options)
        launch(a, b, c)
    assert launch.options["num_stages"] < 4
    assert shared(BLOCK_K=128, **blocks, **launch.options) <= limit
    torch.testing.assert_close(c, want, atol=1e-2, rtol=1e-2)
    kernel = autotune(kernels.SPACE, key=["K"], default=kernels.SPACE[-1])(kernels.tile_dot_kernel)
    c.zero_()
    with simulated_device(RTX_5090.facts()):
        kernel[(1,)](a, b, c, 1024, **blocks)
    (passed_over,) = kernel.too_large.values()
    assert lc.same_config(passed_over[0][0], kernels.SPACE[-1]) and passed_over[0][1] > limit
    assert shared(**blocks, **kernel.best_config.all_kwargs()) <= limit
    torch.testing.assert_close(c, want, atol=1e-2, rtol=1e-2)
