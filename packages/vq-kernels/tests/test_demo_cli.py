"""The ``vq-kernels demo`` command line: bad values, --help, and short runs (with a stand-in model
and data, so that no kernel runs and nothing is loaded)."""

import json

import pytest
import torch
from torch import nn

from vq_kernels import VQOutput, demo


class _StandIn(nn.Module):
    """Takes the place of ResidualVQ(64, 32, 3, ...): codes 0, nothing restarted."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        codes = torch.zeros(x.shape[0], 3, dtype=torch.int64, device=x.device)
        restarted = torch.zeros(3, 32, dtype=torch.bool, device=x.device)
        return VQOutput(x.clone(), codes, x.new_zeros(()), restarted)


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(demo, "ResidualVQ", _StandIn)
    monkeypatch.setattr(
        demo, "load_data", lambda g: (torch.rand(40, 64, generator=g), "stand-in rows")
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "argument --steps: must be at least 1, got 0"),
        ("-5", "argument --steps: must be at least 1, got -5"),
        ("ten", "argument --steps: expected an integer, got 'ten'"),
    ],
)
def test_bad_steps_is_a_one_line_error_naming_the_flag(capsys, value, message):
    with pytest.raises(SystemExit) as exc:
        demo.main(["demo", "--steps", value])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and message in captured.err
    assert "Traceback" not in captured.err


def test_out_that_is_a_file_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "figures.json"
    path.write_text("{}")
    with pytest.raises(SystemExit) as exc:
        demo.main(["demo", "--out", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --out:" in err and "not a directory" in err


def test_help_describes_steps_and_out_with_their_defaults(capsys):
    with pytest.raises(SystemExit) as exc:
        demo.main(["--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # undo the line wrapping
    assert "--steps N training steps" in out and "(default: 100)" in out
    assert "--out DIR" in out and "(default: print them only)" in out


@pytest.mark.parametrize("steps", [0, -1, True, 2.5])
def test_train_refuses_steps_below_one(steps):
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        demo.train(steps=steps, device="cpu")


@pytest.mark.parametrize(("steps", "timed"), [(1, 1), (10, 10), (12, 2)])
def test_short_runs_report_their_time_per_step(stand_in, steps, timed):
    stats = demo.train(steps=steps, batch=8, device="cpu")
    assert stats["steps"] == steps and stats["timed_steps"] == timed
    assert stats["ms_per_step"] >= 0 and stats["relative_reconstruction_error"] == 0


def test_cli_runs_one_step_and_writes_the_figures(stand_in, tmp_path, capsys):
    demo.main(["demo", "--steps", "1", "--out", str(tmp_path / "out")])
    assert "ms_per_step" in capsys.readouterr().out
    stats = json.loads((tmp_path / "out" / "vq_kernels_demo.json").read_text())
    assert stats["steps"] == 1 and stats["timed_steps"] == 1


def test_demo_trains_on_one_thread_says_so_and_gives_the_callers_count_back(
    stand_in, three_threads, monkeypatch, tmp_path
):
    seen = []
    forward = _StandIn.forward

    def counting(self, x):
        seen.append(torch.get_num_threads())
        return forward(self, x)

    monkeypatch.setattr(_StandIn, "forward", counting)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU run, on any machine
    result = demo.run_demo(tmp_path)
    assert len(seen) > 10 and set(seen) == {1}  # the timed steps included
    assert torch.get_num_threads() == 3
    stats = json.loads((tmp_path / "vq_kernels_demo.json").read_text())
    assert stats["threads"] == 1
    assert stats["timing"] == "mean of 90 steps after 10 warm-up steps, 1 thread, CPU"
    assert f"ms per training step ({stats['timing']})" in result.summary
