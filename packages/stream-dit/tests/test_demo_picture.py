"""The demo: its ticks run on one PyTorch thread and give the caller's count back, its printed
speed says how it was taken, and its picture says what it shows."""

import json

import pytest
import torch

from stream_dit import demo
from stream_dit.session import StreamSession


@pytest.fixture
def on_cpu(monkeypatch):
    """The demo's CPU run, on any machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_demo_ticks_on_one_thread_and_says_so(tmp_path, three_threads, on_cpu, monkeypatch):
    seen = []

    class Counting(StreamSession):
        def tick(self, *args, **kwargs):  # the timed loop
            seen.append(torch.get_num_threads())
            return super().tick(*args, **kwargs)

    monkeypatch.setattr(demo, "StreamSession", Counting)
    result = demo.run_demo(tmp_path, requests=2, depth=2, steps=2, vae="none")

    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == 3
    figures = json.loads((tmp_path / "stream_dit_demo.json").read_text())
    assert figures["threads"] == 1
    assert figures["timing"] == f"mean of {figures['ticks']} ticks of one run, 1 thread, CPU"
    assert f"ms per tick ({figures['timing']})" in result.summary
    assert "over the ticks' wall time" in result.key_figure


def test_demo_picture_is_titled_with_the_clip_and_its_sample_rate(tmp_path, on_cpu, monkeypatch):
    pytest.importorskip("diffusers")  # the demo's decoder (the tiny VAE) comes with the extra
    pictures = []
    write = demo.write_audio_picture

    def recording(audio, path, **kwargs):
        pictures.append(kwargs)
        return write(audio, path, **kwargs)

    monkeypatch.setattr(demo, "write_audio_picture", recording)
    demo.run_demo(tmp_path, requests=2, depth=2, steps=2)

    figures = json.loads((tmp_path / "stream_dit_demo.json").read_text())
    (kwargs,) = pictures
    assert kwargs["sample_rate"] == figures["audio"]["sample_rate"]
    assert kwargs["title"].startswith("stream-dit demo: request 1 of 2, dit (tiny, random weights)")
    assert kwargs["title"].endswith("decoded by the tiny VAE")
    assert (tmp_path / "stream_dit_demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
