import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from kplanes_resume_child import STEPS, config, data

from tomo_kplanes.checkpoint import load_checkpoint, save_checkpoint
from tomo_kplanes.train import reconstruct


@pytest.mark.timeout(300)
def test_sigkill_between_checkpoints_then_resume_matches_an_uninterrupted_run(tmp_path):
    ckpt = tmp_path / "ck.pt"
    child = Path(__file__).parent / "kplanes_resume_child.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen(
        [sys.executable, str(child), str(ckpt), str(torch.get_num_threads())], env=env
    )
    try:
        deadline = time.monotonic() + 240
        step = 0
        while step < 8:
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no second checkpoint in time"
            if ckpt.exists():
                step = load_checkpoint(ckpt)["step"]
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    killed_at = load_checkpoint(ckpt)["step"]
    assert proc.returncode == -signal.SIGKILL and 8 <= killed_at < STEPS
    geo, series = data()
    resumed = reconstruct(series, geo, config(str(ckpt)), resume=True)
    full = reconstruct(series, geo, config(None))
    assert resumed.steps_run == full.steps_run == STEPS
    assert resumed.losses == full.losses and resumed.holdout_losses == full.holdout_losses
    ref = full.object_model.state_dict()
    for name, value in resumed.object_model.state_dict().items():
        torch.testing.assert_close(value, ref[name], rtol=0, atol=0, msg=name)


def test_a_failed_write_leaves_the_old_checkpoint_and_no_temporary_file(tmp_path, monkeypatch):
    path = save_checkpoint({"step": 1, "w": torch.ones(3)}, tmp_path / "ck.pt")
    real_save = torch.save

    def torn_save(obj, f):
        real_save(obj, f)
        f.write(b"half of the next")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint({"step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.pt"]


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_crafted_checkpoint_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    with path.open("wb") as f:
        pickle.dump({"step": 1, "field": _Payload()}, f, protocol=2)
    with pytest.raises(ValueError, match="not unpickled") as err:
        load_checkpoint(path)
    assert "weights_only" not in str(err.value)  # never the advice to load it unsafely
    for name, raw in (("junk.pt", b"not a checkpoint"), ("text.pt", b"hello world, \x80 e")):
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(ValueError, match=f"{name}.* is not a tomo-kplanes checkpoint") as err:
            load_checkpoint(tmp_path / name)
        assert "weights_only" not in str(err.value)
    with (tmp_path / "old.pt").open("wb") as f:  # a plain pickle, as older tools wrote
        pickle.dump([1, 2], f)
    with pytest.raises(ValueError, match="not a tomo-kplanes checkpoint") as err:
        load_checkpoint(tmp_path / "old.pt")
    assert "weights_only" not in str(err.value)
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="not a dict"):
        load_checkpoint(tmp_path / "list.pt")
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")


def test_training_checkpoint_loads_with_weights_only(tmp_path):
    geo, series = data()
    cfg = config(str(tmp_path / "ck.pt"))
    reconstruct(series, geo, cfg, stop_at=4)
    state = torch.load(tmp_path / "ck.pt", weights_only=True)
    assert state["step"] == 4 and state["generator"].dtype == torch.uint8
