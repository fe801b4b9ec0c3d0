"""warmup(): shape notation, the training step it runs under the interpreter (field, loss, plane
TV, backward), on worker threads and without benchmarking; the CLI's --warmup."""

from __future__ import annotations

import importlib
from collections import Counter

import pytest
import torch

import tomo_kplanes
import triton_dispatch
from tomo_kplanes.cli import main
from triton_dispatch.launch import KernelLaunch
from triton_dispatch.warmup import WarmupReport

warmup_module = importlib.import_module("tomo_kplanes.warmup")

# resolution 8, C = 4: one channel block; 16 rays of 4 samples and 16 volume-TV points
TINY = dict(device="cpu", rays=16, samples=4, tv_points=16)


@pytest.fixture
def launched(monkeypatch):
    """Names of the kernels launched through bound launches, counted by module."""
    seen: Counter = Counter()
    call = KernelLaunch.__call__

    def counting(self, *args, **kwargs):
        fn = getattr(self.kernel, "fn", self.kernel)
        while hasattr(fn, "fn"):
            fn = fn.fn
        seen[f"{fn.__module__.rsplit('.', 2)[-2]}.{fn.__name__}"] += 1
        return call(self, *args, **kwargs)

    monkeypatch.setattr(KernelLaunch, "__call__", counting)
    return seen


@pytest.fixture
def no_autotune(monkeypatch):
    for name in (triton_dispatch.AUTOTUNE_ENV_VAR, "TOMO_KPLANES_AUTOTUNE"):
        monkeypatch.delenv(name, raising=False)


def test_warmup_runs_a_training_step_per_shape(launched, no_autotune):
    before = triton_dispatch.benchmark_count()
    cpu_state = torch.random.get_rng_state()
    report = tomo_kplanes.warmup(["8x4x2", "8x4x1:plain"], **TINY)
    assert isinstance(report, WarmupReport)
    assert report.calls == 2 and report.seconds >= 0
    # no benchmark by default, and the caller's random stream is untouched
    assert triton_dispatch.benchmark_count() == before
    assert torch.equal(torch.random.get_rng_state(), cpu_state)
    if triton_dispatch.interpreter_enabled():
        # the features forward and backward, the fused loss and the plane TV's gradient
        for kernel in (
            "tilted_plane_features._forward_kernel",
            "tilted_plane_features._backward_kernel",
            "ray_loss._forward_kernel",
            "ray_loss._backward_kernel",
            "plane_tv._backward_kernel",
        ):
            assert launched[kernel] >= 1, (kernel, launched)


def test_warmup_on_worker_threads(no_autotune):
    before = triton_dispatch.benchmark_count()
    options = dict(TINY, tv_points=0)
    report = tomo_kplanes.warmup(["8x4x2", (8, 4, 1)], workers=2, **options)
    assert report.calls == 2
    assert triton_dispatch.benchmark_count() == before


def test_tuning_shapes_parse_and_cover_the_regimes():
    parsed = [warmup_module.parse_shape(s) for s in warmup_module.TUNING_SHAPES]
    assert len(parsed) == len(set(warmup_module.TUNING_SHAPES))
    assert ((200, 32, 4), frozenset()) in parsed  # the 200³ benchmark's step
    learned = {(c, t) for (_, c, t), flags in parsed if not flags}
    assert learned >= {(c, t) for c in (16, 32, 64) for t in (1, 2, 4, 8)}
    assert any("plain" in flags for _, flags in parsed)


def test_parse_shape_notation():
    parse = warmup_module.parse_shape
    assert parse("200x32x4") == ((200, 32, 4), frozenset())
    assert parse(" 64X16x1:PLAIN ") == ((64, 16, 1), frozenset({"plain"}))
    assert parse((64, 16, 2)) == ((64, 16, 2), frozenset())


@pytest.mark.parametrize(
    "bad",
    ["12x", "0x4x8", "axb", "8x4", "8x0x2", "8x4x2x1", "1x4x2", "8x4x2:plain", "8x4x2:bogus",
     (8, 4), (8, 0, 2), (8.0, 4, 2), 12],
)  # fmt: skip
def test_bad_shapes_name_the_argument_and_the_notation(bad):
    with pytest.raises(ValueError, match="shapes") as info:
        tomo_kplanes.warmup([bad], **TINY)
    if isinstance(bad, str) and bad in ("12x", "axb", "0x4x8"):
        assert "RxCxT" in str(info.value)


@pytest.mark.parametrize(
    "options, name",
    [({"rays": 0}, "rays"), ({"samples": 0}, "samples"), ({"tv_points": -1}, "tv_points"),
     ({"dtype": torch.bfloat16}, "dtype")],
)  # fmt: skip
def test_bad_options_name_themselves(options, name):
    with pytest.raises(ValueError, match=name):
        tomo_kplanes.warmup(["8x4x2"], **{**TINY, **options})


def test_cli_help_documents_warmup(capsys):
    with pytest.raises(SystemExit):
        main(["reconstruct", "--help"])
    assert "--warmup" in capsys.readouterr().out


def test_cli_reconstruct_with_warmup_prints_the_report(tmp_path, capsys):
    fast = ["--steps", "2", "--sirt-iterations", "1", "--rays-per-batch", "16", "--channels", "2",
            "--rotations", "1", "--no-progress", "--device", "cpu", "--backend", "torch",
            "--tv-points", "16"]  # fmt: skip
    out = tmp_path / "run"
    args = ["reconstruct", "--size", "12", "--angle-step", "30", "--output", str(out), "--warmup"]
    assert main([*args, *fast]) == 0
    captured = capsys.readouterr()
    assert "warm-up: 1 calls in" in captured.err
    assert "seconds_warmup" in captured.out
