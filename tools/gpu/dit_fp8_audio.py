"""ACE-Step 1.5 with FP8 projections against bf16, end to end: the same requests (60 s, turbo
schedule, depth 8) through a session with the fused audio decoder, once with each, and the
relative error of the finished latents and of the decoded audio (the audio's signal-to-error
ratio in dB beside it).

    python3 tools/gpu/dit_fp8_audio.py --out dit_fp8_audio.json [--requests 4]

Runs on the GPU machine with the packages' ``src`` folders and diffusers on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import torch

from stream_dit import Request, StreamSession, TorchEngine
from stream_dit.decode import AudioDecoder, DecoderEngine, window_lengths
from stream_dit.decode.oobleck import OobleckAdapter, build_vae
from stream_dit.model import build_denoiser
from stream_dit.model.ace_step_fused import FP8_ENV_VAR


def run(fp8: bool, requests: int, frames: int, args) -> tuple[list, list]:
    os.environ[FP8_ENV_VAR] = "1" if fp8 else "0"
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    model = build_denoiser("ace-step", args.preset, seed=0, device=args.device, dtype=dtype)
    if not cuda:
        model.fused = True  # the fused path (and its FP8 route) under Triton's interpreter
    engine = TorchEngine(model, max_batch=8, max_frames=frames, max_cond_len=64)
    vae = build_vae(args.vae, seed=0, device=args.device, dtype=dtype)
    dec = DecoderEngine(
        OobleckAdapter(vae),
        max_batch=1,
        mode="fused-graphs" if cuda else "eager",
        graph_lengths=window_lengths(768, 16) if cuda else None,
    )
    window = 768 if cuda else 32
    decoder = AudioDecoder(dec, window=window, crossfade=1, window_align=16 if cuda else 1)
    session = StreamSession(model, engine, depth=8, decoder=decoder)
    gen = torch.Generator().manual_seed(0)
    conds = [torch.randn(64, model.cond_dim, generator=gen) for _ in range(requests)]
    handles = [
        session.submit(Request(frames=frames, cond=c, seed=i, steps=8, shift=3.0))
        for i, c in enumerate(conds)
    ]
    session.run_until_idle()
    assert all(h.audio_done for h in handles)
    assert model.prepare().fp8 == fp8
    return [h.result.float().cpu() for h in handles], [h.audio.float().cpu() for h in handles]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "dit_fp8_audio.json"))
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--frames", type=int, default=1500)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run (tiny sizes, interpreter)")
    ap.add_argument("--preset", default="published")
    ap.add_argument("--vae", default="ace-step")
    args = ap.parse_args()
    latents_bf16, audio_bf16 = run(False, args.requests, args.frames, args)
    latents_fp8, audio_fp8 = run(True, args.requests, args.frames, args)
    rows = []
    for i, (lb, lf, ab, af) in enumerate(zip(latents_bf16, latents_fp8, audio_bf16, audio_fp8)):
        audio_err = ((af - ab).norm() / ab.norm()).item()
        rows.append({
            "request": i,
            "latent_rel_err": ((lf - lb).norm() / lb.norm()).item(),
            "audio_rel_err": audio_err,
            "audio_snr_db": -20 * math.log10(max(audio_err, 1e-12)),
        })  # fmt: skip
        print(rows[-1], flush=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    result = {"device": device, "torch": torch.__version__,
              "frames": args.frames, "rows": rows}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
