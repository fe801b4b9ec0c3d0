"""warmup(): shape notation, the calls it runs (forward, backward, EMA update, search) under the
interpreter, on worker threads, and without benchmarking."""

from __future__ import annotations

import importlib
from collections import Counter

import pytest
import torch

import triton_dispatch
import vq_kernels
from triton_dispatch.launch import KernelLaunch
from triton_dispatch.warmup import WarmupReport

warmup_module = importlib.import_module("vq_kernels.warmup")

# rows x codes x dim [x levels]: one row tile and one code tile of the interpreter's blocks
TINY = ["16x8x4x2", "16x8x4:infer", "16x8x4:cosine,fp16"]


@pytest.fixture
def launched(monkeypatch):
    """Names of the kernels launched through bound launches, counted."""
    seen: Counter = Counter()
    call = KernelLaunch.__call__

    def counting(self, *args, **kwargs):
        seen[getattr(self.kernel, "__name__", None) or self.kernel.fn.__name__] += 1
        return call(self, *args, **kwargs)

    monkeypatch.setattr(KernelLaunch, "__call__", counting)
    return seen


@pytest.fixture
def no_autotune(monkeypatch):
    for name in (triton_dispatch.AUTOTUNE_ENV_VAR, "VQ_KERNELS_AUTOTUNE"):
        monkeypatch.delenv(name, raising=False)


def test_warmup_runs_every_shape_on_cpu(launched, no_autotune):
    before = triton_dispatch.benchmark_count()
    cpu_state = torch.random.get_rng_state()
    report = vq_kernels.warmup(TINY, device="cpu")
    assert isinstance(report, WarmupReport)
    assert report.calls == len(TINY) and report.seconds >= 0
    # no benchmark by default, and the caller's random stream is untouched
    assert triton_dispatch.benchmark_count() == before
    assert torch.equal(torch.random.get_rng_state(), cpu_state)
    if triton_dispatch.interpreter_enabled():
        # the training step's search, backward and EMA update, and the inference search
        for kernel in (
            "residual_quantize_kernel",
            "residual_grad_kernel",
            "small_update_kernel",
            "nearest_code_kernel",
        ):
            assert launched[kernel] >= 1, (kernel, launched)


def test_warmup_on_worker_threads(no_autotune):
    before = triton_dispatch.benchmark_count()
    report = vq_kernels.warmup(["16x8x4x2", (16, 8, 4), "16x8x4x2:infer"], device="cpu", workers=2)
    assert report.calls == 3
    assert triton_dispatch.benchmark_count() == before


def test_forward_only_and_dtype_argument():
    report = vq_kernels.warmup("16x8x4x2", device="cpu", dtype=torch.float16, backward=False)
    assert report.calls == 1


def test_tuning_shapes_parse_and_cover_the_regimes():
    parsed = [warmup_module.parse_shape(s) for s in warmup_module.TUNING_SHAPES]
    assert len(parsed) == len(set(warmup_module.TUNING_SHAPES))
    assert ((640, 256, 64, 3), frozenset()) in parsed  # the rvq_step benchmark's step
    training = [(sizes, flags) for sizes, flags in parsed if "infer" not in flags]
    assert {sizes[1] for sizes, _ in training} >= {256, 1024}
    assert max(sizes[2] for sizes, _ in training) >= 256
    assert any(sizes[0] == 65536 for sizes, _ in training)
    # fp32 and bf16 of the same regimes
    assert ((65536, 256, 64, 3), frozenset({"bf16"})) in parsed
    assert ((65536, 256, 64, 3), frozenset()) in parsed


def test_parse_shape_notation():
    parse = warmup_module.parse_shape
    assert parse("640x256x64") == ((640, 256, 64, 1), frozenset())
    assert parse(" 640X256x64x3:BF16,cosine ") == ((640, 256, 64, 3), frozenset({"bf16", "cosine"}))
    assert parse((640, 256, 64, 3)) == ((640, 256, 64, 3), frozenset())


@pytest.mark.parametrize(
    "bad",
    ["12x", "0x4x8", "axb", "8x4x8x0", "8x4", "8x4x8x2x1", "8x4x8:bogus", "8x4x8:bf16,fp32",
     (8, 4), (8, 0, 4), (8, 4, 2.5), 12],
)  # fmt: skip
def test_bad_shapes_name_the_argument_and_the_notation(bad):
    with pytest.raises(ValueError, match="shapes") as info:
        vq_kernels.warmup([bad], device="cpu")
    if isinstance(bad, str) and bad in ("12x", "axb", "0x4x8"):
        assert "BxKxD" in str(info.value)
