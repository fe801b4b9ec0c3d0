"""``uv run demo`` / ``stream-dit demo``: stream a handful of requests through a tiny model (the
built-in DiT, or ACE-Step 1.5's diffusers transformer at a tiny size with ``--model ace-step``),
decode them to audio with the session's decoder stage, and write the first one as a WAV file and a
waveform/spectrogram picture."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from triton_dispatch import DemoResult, select_backend
from triton_dispatch.demo import pinned_threads, timing_conditions

from .decode.registry import build_audio_decoder, default_vae
from .model import FRAME_RATE, build_denoiser
from .picture import write_audio_picture
from .request import Request
from .session import StreamSession
from .wav import peak_normalize, wav_bytes


def run_demo(
    output_dir: Path,
    *,
    requests: int = 8,
    depth: int = 4,
    steps: int = 8,
    model: str = "dit",
    warmup: bool = False,
    vae: str = "auto",
) -> DemoResult:
    """Serve ``requests`` mixed requests (plain, CFG, RCFG, SDE noise) at ``depth`` on the tiny
    size of ``model`` and report ticks, latents/s and audio × realtime; writes
    ``stream_dit_demo.json``. With ``warmup``, :func:`stream_dit.warmup.warmup` runs the demo's
    shapes before the timed ticks (its one-line report goes to stderr).

    With a decoder (``vae``, see :func:`stream_dit.decode.registry.build_audio_decoder`; ``auto``
    is ACE-Step 1.5's VAE at its published size on CUDA and the tiny one on the host, none
    without diffusers), the session decodes every request and the first one is written as
    ``stream_dit_demo.wav`` (peak-normalised to -1 dBFS, 16-bit) and ``stream_dit_demo.png``.
    The weights are random: the audio is noise shaped by the decoder, not music.

    On the CPU the demo runs on one PyTorch thread (see
    :func:`triton_dispatch.demo.pinned_threads`) and gives the caller's count back after."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with pinned_threads(device) as threads:
        return _run_demo(output_dir, requests, depth, steps, model, warmup, vae, device, threads)


def _run_demo(
    output_dir: Path,
    requests: int,
    depth: int,
    steps: int,
    model: str,
    warmup: bool,
    vae: str,
    device: str,
    threads: int | None,
) -> DemoResult:
    denoiser = build_denoiser(model, "tiny", seed=0, device=device)
    if vae == "auto" and device == "cuda":
        vae = "ace-step"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    decoder = build_audio_decoder(
        vae,
        model=model,
        preset="tiny",
        device=device,
        dtype=dtype,
        latent_channels=denoiser.latent_channels,
    )
    session = StreamSession(denoiser, depth=depth, max_queue=requests, decoder=decoder)
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
    ticks = session.ticks
    timing = (
        f"mean of {ticks} tick{'' if ticks == 1 else 's'} of one run, "
        f"{timing_conditions(device, threads)}"
    )
    figures = {
        "model": model,
        "requests": requests,
        "finished": ok,
        "depth": depth,
        "ticks": session.ticks,
        "ms_per_tick": 1e3 * elapsed / max(session.ticks, 1),
        "timing": timing,
        "latents_per_s": ok / elapsed,
        "audio_x_realtime": audio / elapsed,
        "device": device,
        "threads": threads,
        "warmup_s": warm_s,
    }
    outputs = []
    if decoder is not None:
        first = handles[0]
        if first.audio_done:
            audio = peak_normalize(first.audio)
            wav = output_dir / "stream_dit_demo.wav"
            wav.write_bytes(wav_bytes(audio, decoder.sample_rate, "pcm16"))
            vae_name = default_vae(model, "tiny") if vae == "auto" else vae
            picture = write_audio_picture(
                audio,
                output_dir / "stream_dit_demo.png",
                sample_rate=decoder.sample_rate,
                title=(
                    f"stream-dit demo: request 1 of {requests}, {model} (tiny, random weights) "
                    f"decoded by the {vae_name} VAE"
                ),
            )
            outputs += [wav, picture]
        figures["audio"] = {
            "sample_rate": decoder.sample_rate,
            "decoded": sum(h.audio_done for h in handles),
            "windows": decoder.windows_decoded,
            "decoder_calls": decoder.calls,
            "seconds_each": frames / FRAME_RATE,
        }
    out = output_dir / "stream_dit_demo.json"
    out.write_text(json.dumps(figures, indent=2))
    outputs.insert(0, out)
    return DemoResult(
        summary=(
            f"{model}: {ok}/{requests} requests in {ticks} ticks at depth {depth}, "
            f"{figures['ms_per_tick']:.1f} ms per tick ({timing})"
        ),
        backend=select_backend(device=torch.device(device)),
        key_figure=(
            f"{figures['audio_x_realtime']:.1f}x realtime audio "
            f"({figures['latents_per_s']:.1f} latents/s; over the ticks' wall time)"
        ),
        outputs=outputs,
    )
