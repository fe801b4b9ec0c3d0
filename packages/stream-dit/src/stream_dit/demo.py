"""``uv run demo`` / ``stream-dit demo``: stream a handful of requests through a tiny model (the
built-in DiT, or ACE-Step 1.5's diffusers transformer at a tiny size with ``--model ace-step``)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from triton_dispatch import DemoResult, select_backend

from .model import FRAME_RATE, build_denoiser
from .request import Request
from .session import StreamSession


def run_demo(
    output_dir: Path,
    *,
    requests: int = 8,
    depth: int = 4,
    steps: int = 8,
    model: str = "dit",
    warmup: bool = False,
) -> DemoResult:
    """Serve ``requests`` mixed requests (plain, CFG, RCFG, SDE noise) at ``depth`` on the tiny
    size of ``model`` and report ticks, latents/s and audio × realtime; writes
    ``stream_dit_demo.json``. With ``warmup``, :func:`stream_dit.warmup.warmup` runs the demo's
    shapes before the timed ticks (its one-line report goes to stderr)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    denoiser = build_denoiser(model, "tiny", seed=0, device=device)
    session = StreamSession(denoiser, depth=depth, max_queue=requests)
    gen = torch.Generator().manual_seed(0)
    kinds = [
        {},
        {"cfg_type": "full", "guidance": 3.0},
        {"cfg_type": "self", "guidance": 2.0},
        {"noise": [0.3, 0.0]},
    ]
    frames = 50  # two seconds of audio latents
    cond_len = 6
    warm_s = None
    if warmup:
        from .warmup import warmup as warm_session

        report = warm_session(session, frames=frames, cond_lens=cond_len)
        print(report, file=sys.stderr)
        warm_s = report.seconds
    handles = [
        session.submit(
            Request(
                frames=frames,
                cond=torch.randn(cond_len, denoiser.cond_dim, generator=gen),
                seed=i,
                steps=steps,
                shift=3.0,
                **kinds[i % len(kinds)],
            )
        )
        for i in range(requests)
    ]
    start = time.perf_counter()
    while not session.idle:
        session.tick()
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    ok = sum(h.result is not None and bool(torch.isfinite(h.result).all()) for h in handles)
    audio = ok * frames / FRAME_RATE
    figures = {
        "model": model,
        "requests": requests,
        "finished": ok,
        "depth": depth,
        "ticks": session.ticks,
        "ms_per_tick": 1e3 * elapsed / max(session.ticks, 1),
        "latents_per_s": ok / elapsed,
        "audio_x_realtime": audio / elapsed,
        "device": device,
        "warmup_s": warm_s,
    }
    out = output_dir / "stream_dit_demo.json"
    out.write_text(json.dumps(figures, indent=2))
    return DemoResult(
        summary=f"{model}: {ok}/{requests} requests in {session.ticks} ticks at depth {depth} ({figures['ms_per_tick']:.1f} ms/tick)",
        backend=select_backend(device=torch.device(device)),
        key_figure=f"{figures['audio_x_realtime']:.1f}x realtime audio ({figures['latents_per_s']:.1f} latents/s)",
        outputs=[out],
    )
