import pytest
import torch

import triton_dispatch
from late_interaction_kernels import warmup
from late_interaction_kernels.warmup import TUNING_SHAPES, parse_shape


def test_every_tuning_shape_parses():
    for spec in TUNING_SHAPES:
        sizes, _ = parse_shape(spec)
        assert len(sizes) == 5 and min(sizes) > 0
    assert parse_shape("2x3x4x5") == ((2, 3, 4, 5, 128), frozenset())
    assert parse_shape("2x3x4x5x64:mask,pairs") == ((2, 3, 4, 5, 64), {"mask", "pairs"})
    assert parse_shape((2, 3, 4, 5, 96)) == ((2, 3, 4, 5, 96), frozenset())


@pytest.mark.parametrize("bad", ["12x", "0x4x8x9", "axbxcxd", "2x3x4x5:wings", (2, 3), (2, 3, 4, 0)])
def test_bad_shapes_name_the_argument(bad):
    with pytest.raises(ValueError, match="shapes"):
        warmup([bad], device="cpu")


@pytest.mark.parametrize("workers", [1, 2])
def test_warmup_runs_every_shape_without_benchmarking(workers):
    before = triton_dispatch.benchmark_count()
    shapes = ["2x3x5x7x16", "2x2x5x7x16:mask,lowmem", "2x2x5x7x16:pairs", "1x4x5x9x16:topk"]
    report = warmup(shapes, device="cpu", dtype=torch.float32, workers=workers)
    assert report.calls == len(shapes) and report.seconds > 0
    assert triton_dispatch.benchmark_count() == before
    assert "warm-up: 4 calls" in str(report)
