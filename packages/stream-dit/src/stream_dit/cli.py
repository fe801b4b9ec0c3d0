"""stream-dit: serve the session over HTTP, bench the tick, run the demo."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from .decode.engine import DECODER_MODES
from .decode.registry import VAES
from .engines.torch_engine import MODES
from .model.registry import MODELS

_MODEL_HELP = (
    "dit: the built-in DiT; ace-step: diffusers' ACE-Step 1.5 transformer; stable-audio: "
    "diffusers' Stable Audio Open DiT (both extra diffusers)"
)
_PRESET_HELP = (
    "model size: dit tiny/small/base/large, ace-step tiny/small/published, "
    "stable-audio tiny/published "
    "(default: large / published on CUDA, tiny on CPU)"
)
_VAE_HELP = (
    "audio decoder (diffusers' AutoencoderOobleck, random weights): tiny (CPU), ace-step "
    "(ACE-Step 1.5, 48 kHz), stable-audio (44.1 kHz); auto: the model's own, tiny for tiny "
    "presets, none without diffusers; none: latents only"
)


def _decoder_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vae", choices=VAES, default="auto", help=_VAE_HELP)
    p.add_argument(
        "--decoder-mode", choices=("auto", *DECODER_MODES), default="auto",
        help="auto: the fused Triton decoder in CUDA graphs on a GPU, eager elsewhere",
    )  # fmt: skip
    p.add_argument(
        "--decode-window", type=int, default=None,
        help="latent frames per decoder window (default: 768 for the fused decoder, 256 otherwise)",
    )  # fmt: skip
    p.add_argument(
        "--decode-context",
        type=int,
        default=None,
        help="context frames on each side of a window (default: the decoder's receptive field, "
        "which makes windows exact)",
    )
    p.add_argument("--decode-crossfade", type=int, default=1, help="crossfade frames at seams")
    p.add_argument(
        "--decode-align", type=int, default=16,
        help="shorten a latent's windows to the shortest multiple of this many frames that needs "
        "no more windows (0: every window --decode-window frames)",
    )  # fmt: skip
    p.add_argument("--decode-batch", type=int, default=1, help="windows per decoder call")


def _build_decoder(args: argparse.Namespace, dtype: torch.dtype, latent_channels: int):
    from .decode.registry import build_audio_decoder

    return build_audio_decoder(
        args.vae,
        model=args.model,
        preset=args.preset,
        seed=args.seed,
        device=args.device,
        dtype=dtype,
        mode=args.decoder_mode,
        window=args.decode_window,
        context=args.decode_context,
        crossfade=args.decode_crossfade,
        window_align=args.decode_align,
        batch_windows=args.decode_batch,
        latent_channels=latent_channels,
    )


def _device_default() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _bench(args: argparse.Namespace) -> int:
    from .benchmark import BenchConfig, format_result, run

    on_gpu = args.device.startswith("cuda")
    cfg = BenchConfig(
        model=args.model,
        preset=args.preset,
        depth=args.depth,
        steps=args.steps,
        ticks=args.ticks,
        warmup=args.warmup,
        frames=args.frames,
        cond_len=args.cond_len,
        cfg=args.cfg,
        engine=args.engine,
        device=args.device,
        dtype=args.dtype or ("bfloat16" if on_gpu else "float32"),
        baselines=not args.no_baselines,
        engine_warmup=args.engine_warmup,
    )
    res = run(cfg)
    if "warmup" in res:
        print(res["warmup"]["summary"], file=sys.stderr)
    print(format_result(res))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2, default=str))
    return 0


def _serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from .server import create_app
    except ImportError:
        print(
            "stream-dit serve needs the serve extra: pip install 'stream-dit[serve]'",
            file=sys.stderr,
        )
        return 2
    from .engines import TorchEngine
    from .model import build_denoiser
    from .session import StreamSession
    from .warmup import forward_shapes, warmup

    dtype = getattr(
        torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    )
    model = build_denoiser(args.model, args.preset, seed=args.seed, device=args.device, dtype=dtype)
    engine = TorchEngine(
        model,
        max_batch=2 * args.depth,
        max_frames=args.max_frames,
        max_cond_len=args.max_cond_len,
        mode=args.engine_mode,
    )
    try:
        decoder = _build_decoder(args, dtype, model.latent_channels)
    except (ValueError, TypeError, ImportError) as exc:
        print(f"stream-dit serve: {exc}", file=sys.stderr)
        return 2
    session = StreamSession(
        model, engine, depth=args.depth, max_queue=args.max_queue, decoder=decoder
    )
    if args.warmup:
        try:  # bad warm-up shapes are refused here, not on the server's warm-up thread
            forward_shapes(session, frames=args.warmup_frames, cond_lens=args.warmup_cond_len)
        except (ValueError, TypeError) as exc:
            print(f"stream-dit serve: {exc}", file=sys.stderr)
            return 2

    def warm(session: StreamSession):
        report = warmup(session, frames=args.warmup_frames, cond_lens=args.warmup_cond_len)
        print(report, file=sys.stderr, flush=True)
        return report

    app = create_app(
        session,
        warmup=warm if args.warmup else False,
        max_steps=args.max_steps,
        max_curve_len=args.max_curve_len,
        max_body_bytes=args.max_body_bytes,
        request_timeout_s=args.request_timeout,
        retry_after_s=args.retry_after,
        max_uploads=args.max_uploads,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        limit_concurrency=args.max_connections,
    )
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    res = run_demo(
        Path(args.output_dir),
        requests=args.requests,
        depth=args.depth,
        model=args.model,
        warmup=args.warmup,
        vae=args.vae,
    )
    print(f"{res.summary}; {res.key_figure} [{res.backend}]")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stream-dit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("bench", help="time the tick against a naive loop and a host-synced tick")
    b.add_argument("--depth", type=int, default=4)
    b.add_argument("--steps", type=int, default=8)
    b.add_argument("--ticks", type=int, default=200)
    b.add_argument(
        "--warmup", type=int, default=30, help="untimed ticks before the timed ones (default 30)"
    )
    b.add_argument(
        "--engine-warmup",
        action="store_true",
        help="before timing, run stream_dit.warmup for the bench's shapes (every row count, its "
        "frames and cond length, the fused guidance kernel) and print its one-line report to "
        "stderr; --out records it under 'warmup'",
    )
    b.add_argument("--cfg", action="store_true", help="guided requests (full CFG)")
    b.add_argument("--engine", choices=["torch", *MODES[1:]], default="torch")
    b.add_argument("--model", choices=MODELS, default="dit", help=_MODEL_HELP)
    b.add_argument("--preset", default=None, help=_PRESET_HELP)
    b.add_argument(
        "--frames", type=int, default=250, help="latent frames per request (25 per second)"
    )
    b.add_argument("--cond-len", type=int, default=64)
    b.add_argument("--device", default=_device_default())
    b.add_argument("--dtype", default=None)
    b.add_argument("--no-baselines", action="store_true")
    b.add_argument("--out", default=None, help="write the figures as JSON")
    b.set_defaults(fn=_bench)

    s = sub.add_parser("serve", help="serve the session over HTTP (needs the serve extra)")
    s.add_argument(
        "--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)"
    )
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--model", choices=MODELS, default="dit", help=_MODEL_HELP)
    s.add_argument("--preset", default="tiny", help=_PRESET_HELP)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--depth", type=int, default=4)
    s.add_argument(
        "--max-queue", type=int, default=64, help="requests waiting for a slot before 503"
    )
    s.add_argument("--max-frames", type=int, default=750, help="engine limit on frames")
    s.add_argument("--max-cond-len", type=int, default=128, help="engine limit on cond tokens")
    s.add_argument("--max-steps", type=int, default=1000)
    s.add_argument("--max-curve-len", type=int, default=1024, help="values per curve")
    s.add_argument(
        "--max-body-bytes", type=int, default=None, help="request-body cap (default: from limits)"
    )
    s.add_argument("--request-timeout", type=float, default=300.0, help="seconds per request")
    s.add_argument("--retry-after", type=int, default=1, help="Retry-After seconds of a 503")
    s.add_argument(
        "--max-uploads",
        type=int,
        default=None,
        help="request bodies received at once before 503 (default: depth + max-queue)",
    )
    s.add_argument(
        "--max-connections", type=int, default=1024, help="open connections before uvicorn's 503"
    )
    s.add_argument("--log-level", default="info")
    s.add_argument(
        "--engine-mode",
        choices=("auto", *MODES),
        default="auto",
        help="auto: CUDA graphs on a CUDA device, eager elsewhere",
    )
    s.add_argument("--device", default=_device_default())
    s.add_argument("--dtype", default=None)
    s.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="when the server starts, run the engine at every row count a tick can produce and "
        "the fused guidance kernel (stream_dit.warmup) before reporting ready; GET /health answers "
        "503 with state 'warming' meanwhile; the one-line report goes to stderr (default: on)",
    )
    s.add_argument(
        "--warmup-frames",
        type=int,
        nargs="+",
        default=None,
        metavar="T",
        help="frame counts to warm up (each mapped to the engine's T bucket; default: "
        "--max-frames)",
    )
    s.add_argument(
        "--warmup-cond-len",
        type=int,
        nargs="+",
        default=None,
        metavar="L",
        help="conditioning lengths to warm up (each mapped to the engine's L bucket; default: "
        "--max-cond-len)",
    )
    _decoder_arguments(s)
    s.set_defaults(fn=_serve)

    d = sub.add_parser("demo", help="stream a handful of requests through a tiny model")
    d.add_argument("--model", choices=MODELS, default="dit", help=_MODEL_HELP)
    d.add_argument("--output-dir", default="demo-output")
    d.add_argument("--requests", type=int, default=8)
    d.add_argument("--depth", type=int, default=4)
    d.add_argument(
        "--vae",
        choices=VAES,
        default="auto",
        help=_VAE_HELP + "; the demo writes stream_dit_demo.wav and stream_dit_demo.png",
    )
    d.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="run stream_dit.warmup for the demo's shapes before the timed ticks and print its "
        "one-line report to stderr (default: off)",
    )
    d.set_defaults(fn=_demo)

    args = parser.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    raise SystemExit(main())
