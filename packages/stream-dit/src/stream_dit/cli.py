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


def _limit_overrides(args: argparse.Namespace) -> dict:
    """The server limits the serve flags set (``None``: the default)."""
    return {
        "max_steps": args.max_steps,
        "max_curve_len": args.max_curve_len,
        "max_body_bytes": args.max_body_bytes,
        "request_timeout_s": args.request_timeout,
        "retry_after_s": args.retry_after,
        "max_uploads": args.max_uploads,
    }


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
    from .session_spec import SessionSpec, build_session, warmup_of

    spec = SessionSpec.from_values(args)
    if args.ray:
        return _serve_ray(args, spec)
    try:
        session = build_session(spec)
    except (ValueError, TypeError, ImportError) as exc:
        print(f"stream-dit serve: {exc}", file=sys.stderr)
        return 2
    app = create_app(session, warmup=warmup_of(spec) or False, **_limit_overrides(args))
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        limit_concurrency=args.max_connections,
    )
    return 0


def _serve_ray(args: argparse.Namespace, spec) -> int:
    if args.ray_address is None:  # a Ray of this machine alone: nothing listens on the network
        from .ray_env import keep_ray_on_loopback, keep_ray_workers_in_this_environment

        keep_ray_on_loopback()
        keep_ray_workers_in_this_environment()
    try:
        from .ray import RayServeOptions
        from .ray.local import serve_until_stopped
    except ImportError:
        print(
            "stream-dit serve --ray needs the ray extra: pip install 'stream-dit[ray]'",
            file=sys.stderr,
        )
        return 2
    try:
        options = RayServeOptions(
            spec=spec,
            limits=_limit_overrides(args),
            replicas=args.replicas,
            min_replicas=args.min_replicas,
            max_replicas=args.max_replicas,
            target_queue=args.target_queue,
            gpus_per_replica=args.gpus_per_replica,
            cpus_per_replica=args.cpus_per_replica,
            torch_threads=args.torch_threads,
        )
    except (ValueError, TypeError) as exc:
        print(f"stream-dit serve: {exc}", file=sys.stderr)
        return 2
    serve_until_stopped(
        options, host=args.host, port=args.port, address=args.ray_address, num_cpus=args.ray_cpus
    )
    return 0


def _ray_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Ray Serve (extra ray): one replica per GPU behind one ingress")
    g.add_argument(
        "--ray", action="store_true",
        help="serve through Ray Serve (stream_dit.ray): the same HTTP API, requests routed to "
        "--replicas sessions by Ray Serve's router",
    )  # fmt: skip
    g.add_argument("--replicas", type=int, default=None, help="replicas (default 1; fixed count)")
    g.add_argument(
        "--min-replicas", type=int, default=None,
        help="autoscale on queue length between --min-replicas and --max-replicas",
    )  # fmt: skip
    g.add_argument("--max-replicas", type=int, default=None)
    g.add_argument(
        "--target-queue", type=float, default=None,
        help="requests in flight per replica the autoscaler aims at (default: --depth)",
    )  # fmt: skip
    g.add_argument(
        "--gpus-per-replica", type=float, default=None,
        help="GPUs each replica asks Ray for (default: 1 where the cluster has GPUs, else 0)",
    )  # fmt: skip
    g.add_argument(
        "--cpus-per-replica", type=float, default=1.0, help="CPUs each replica asks Ray for"
    )
    g.add_argument(
        "--torch-threads", type=int, default=None,
        help="torch threads per replica (default: 1 on CPU replicas, torch's own on GPU ones)",
    )  # fmt: skip
    g.add_argument(
        "--ray-address", default=None,
        help="join this Ray cluster (e.g. auto); default: start Ray on this machine",
    )  # fmt: skip
    g.add_argument(
        "--ray-cpus", type=int, default=None,
        help="CPUs of the Ray started on this machine (default: all of them)",
    )  # fmt: skip


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
    _ray_arguments(s)
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
