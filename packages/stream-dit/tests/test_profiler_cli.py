import json

import pytest

from stream_dit import TorchEngine
from stream_dit.cli import main
from stream_dit.profiler import categorize, profile_forward


def test_categorize_names():
    assert categorize("aten::_scaled_dot_product_efficient_attention") == "attention"
    assert categorize("sm90_xmma_gemm_bf16bf16_bf16f32") == "gemm"
    assert categorize("aten::addmm") == "gemm"
    assert categorize("aten::native_layer_norm") == "norm"
    assert categorize("void at::native::vectorized_elementwise_kernel<4, add>") == "pointwise"


def test_profile_rolls_up_a_forward(tiny_model):
    res = profile_forward(TorchEngine(tiny_model), 2, 12, 4, warmup=1)
    assert (
        res["total_ms"] > 0
        and res["by_category"]["gemm"] > 0
        and res["by_category"]["attention"] > 0
    )
    assert sum(res["fractions"].values()) == pytest.approx(1.0)


def test_cli_bench_and_demo(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert (
        main(
            [
                "bench",
                "--depth",
                "2",
                "--steps",
                "2",
                "--ticks",
                "3",
                "--warmup",
                "1",
                "--cfg",
                "--frames",
                "8",
                "--cond-len",
                "4",
                "--preset",
                "tiny",
                "--device",
                "cpu",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    assert res["session"]["rows_per_tick"] == 4 and res["naive"]["latents_per_s"] > 0
    assert main(["demo", "--output-dir", str(tmp_path), "--requests", "3", "--depth", "2"]) == 0
    assert "realtime" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["bench", "--engine", "tensorrt"])


@pytest.mark.parametrize("command", [[], ["bench"], ["serve"], ["demo"]])
def test_help_is_plain_text(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: stream-dit {' '.join(command)}".rstrip())
    assert "``" not in out and ":class:" not in out and ":func:" not in out
    if not command:
        assert "stream-dit: serve the session over HTTP, bench the tick, run the demo" in out
