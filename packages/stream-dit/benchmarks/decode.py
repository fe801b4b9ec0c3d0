"""Windowed audio decoding against diffusers' full ``vae.decode``, and DiT + decode end to end.

    python3 packages/stream-dit/benchmarks/decode.py --out decode.json
    python3 packages/stream-dit/benchmarks/decode.py --tiny            # CPU smoke test, seconds

On CUDA (bf16, ACE-Step 1.5's published VAE ``AutoencoderOobleck`` and DiT, random weights):

* ``decode_60s[mode,window,batch]``: one 60 s latent (1500 frames) decoded by the session's
  decoder engine in windows (context from the receptive field, crossfade 1 frame) against
  ``vae.decode`` of the same latent; GPU median (``do_bench``), wall time per call, the first
  call (compilation and graph capture included) and peak memory of both (ours: what the engine
  holds between calls, its CUDA graphs' pool included, plus what a call allocates); targets:
  >= 4x faster, peak <= 1/4. ``extra`` holds the windowed result's largest difference from the full decode
  (relative to its peak). ``decode_60s_tiled_baseline`` times diffusers' own tiled decode
  (``vae.enable_tiling()``) for reference.
* ``e2e_60s[cfg|nocfg]``: completions per second of 60 s of music, ACE-Step turbo schedule (8
  steps, shift 3), depth 8, CUDA-graph DiT, every request decoded to audio; ``baseline_ms`` is the
  same run without the decoder (tick loop alone), ``ours_ms`` with it, both per completion;
  target: the decode adds <= 15 %. DEMON (arXiv 2605.28657) reports 12.3 completions/s on an
  RTX 5090, a different GPU.

``--tiny``: the tiny VAE and the tiny DiT on the host, 2 s of audio, eager: checks the script runs.
"""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from stream_dit import Request, StreamSession, TorchEngine
from stream_dit.decode import AudioDecoder, DecoderEngine, decode_windowed, window_lengths
from stream_dit.decode.fused import FusedOobleck
from stream_dit.model import build_denoiser
from triton_dispatch.bench import (
    BenchRecord,
    benchmark_arguments,
    environment,
    median_ms,
    peak_memory_bytes,
    report,
    synchronize,
    wall_ms_per_call,
)

warnings.filterwarnings("ignore", message=".*weight_norm.*", category=FutureWarning)
from stream_dit.decode.oobleck import OobleckAdapter, build_vae  # noqa: E402

DEMON_COMPLETIONS_PER_S = 12.3  # arXiv 2605.28657, RTX 5090, 60 s of music


def _first_call_ms(fn, device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return (time.perf_counter() - start) * 1e3


def _engine(adapter, mode: str, window: int, batch: int, chunk: int | None, args) -> DecoderEngine:
    """The decoder engine of a variant; ``chunk``: the fused decoder's ``chunk_frames`` (``None``:
    its default)."""
    graph_lengths = None if mode == "eager" else window_lengths(window, args.align)
    if mode.startswith("fused") and chunk is not None:
        adapter = FusedOobleck(adapter, chunk_frames=chunk)
    return DecoderEngine(adapter, max_batch=batch, mode=mode, graph_lengths=graph_lengths)


def _variant(adapter, latent, mode, window, batch, chunk, context, args, device, rep) -> tuple:
    """``(first call ms, audio, bytes held between calls, peak bytes, GPU ms, wall ms)`` of one
    engine; the peak counts what the engine keeps between calls (its CUDA graphs' memory pool and
    static inputs) plus what a call allocates above that. The engine is freed on return."""
    engine = _engine(adapter, mode, window, batch, chunk, args)

    def ours():
        return decode_windowed(
            engine, latent, hop=adapter.hop, window=window, context=context, crossfade=1,
            batch=batch, align=args.align,
        )  # fmt: skip

    with torch.no_grad():
        first = _first_call_ms(ours, device)
        out = ours().float()
    held = engine.graph_memory_bytes() if torch.device(device).type == "cuda" else 0
    peak = peak_memory_bytes(ours, device=device)
    peak = None if peak is None else peak + held
    ms = median_ms(ours, device=device, warmup=rep[0], rep=rep[1])
    wall = wall_ms_per_call(ours, device=device, calls=3 if args.tiny else 10)
    return first, out, held, peak, ms, wall


def _decode_records(args, device, dtype, env) -> list[BenchRecord]:
    vae = build_vae(args.vae, seed=0, device=device, dtype=dtype)
    adapter = OobleckAdapter(vae)
    frames = round(args.seconds * adapter.frame_rate)
    context = adapter.receptive_field.context_frames()
    gen = torch.Generator().manual_seed(0)
    latent = torch.randn(adapter.latent_channels, frames, generator=gen).to(device, dtype)
    shape = {"vae": args.vae, "seconds": args.seconds, "frames": frames, "dtype": str(dtype),
             "cudnn_benchmark": args.cudnn_benchmark}  # fmt: skip
    rep = (2, 3) if args.tiny else (50, 200)

    def full():
        return vae.decode(latent[None]).sample

    with torch.no_grad():
        ref = full()[0].float()
    peak_ref = float(ref.abs().max())
    base_first = None  # the first full decode ran above
    base_peak = peak_memory_bytes(full, device=device)
    base_ms = median_ms(full, device=device, warmup=rep[0], rep=rep[1])
    base_wall = wall_ms_per_call(full, device=device, calls=3 if args.tiny else 10, warmup=1)
    records = []
    variants = [
        (mode, window, batch, chunk)
        for mode in args.modes
        for window in args.windows
        for batch in args.batches
        for chunk in (args.chunk_frames if mode.startswith("fused") else [None])
    ]
    for mode, window, batch, chunk in variants:
        name = f"decode_{args.seconds:g}s[{mode},w{window},b{batch}]"
        if chunk is not None:
            name = name[:-1] + f",c{chunk}]"
        try:
            first, out, held, peak, ms, wall = _variant(
                adapter, latent, mode, window, batch, chunk, context, args, device, rep
            )
            err = float((out - ref).abs().max()) / peak_ref
        except Exception as exc:  # one failing variant must not lose the others
            print(f"{name}: {type(exc).__name__}: {exc}", flush=True)
            continue
        ratio = base_ms / ms
        mem = None if base_peak is None or peak is None else peak / base_peak
        records.append(
            BenchRecord(
                name=name,
                shape={**shape, "mode": mode, "window": window, "batch": batch,
                       "align": args.align, "context": context, "crossfade": 1,
                       "chunk_frames": chunk},
                baseline="diffusers AutoencoderOobleck.decode (full)",
                baseline_ms=base_ms,
                ours_ms=ms,
                baseline_peak_bytes=base_peak,
                ours_peak_bytes=peak,
                baseline_wall_ms=base_wall,
                ours_wall_ms=wall,
                env=env,
                extra={
                    "first_call_ms": first,
                    "held_between_calls_bytes": held,
                    "baseline_first_call_ms": base_first,
                    "max_abs_error_rel_peak": err,
                    "speed_target": ">= 4x",
                    "speed_reached": ratio >= 4,
                    "memory_ratio": mem,
                    "memory_target": "<= 0.25",
                    "memory_reached": None if mem is None else mem <= 0.25,
                },
            )
        )  # fmt: skip
        print(f"{name}: {ms:.2f} ms vs {base_ms:.2f} ms ({ratio:.2f}x), "
              f"peak ratio {mem}, max error {err:.2e} of the peak", flush=True)  # fmt: skip
    vae.enable_tiling()
    tiled_ms = median_ms(full, device=device, warmup=rep[0], rep=rep[1])
    records.append(
        BenchRecord(
            name=f"decode_{args.seconds:g}s_tiled_baseline",
            shape=shape,
            baseline="diffusers AutoencoderOobleck.decode (full)",
            baseline_ms=base_ms,
            ours_ms=tiled_ms,
            baseline_peak_bytes=base_peak,
            ours_peak_bytes=peak_memory_bytes(full, device=device),
            env=env,
            extra={"what": "diffusers' own tiled decode (enable_tiling, 512/64 frames)"},
        )
    )
    vae.disable_tiling()
    return records


def _e2e(args, device, dtype, cfg: bool, with_decoder: bool) -> dict:
    """Completions per second of ``args.requests`` requests of ``args.seconds`` at depth 8."""
    model_name = "dit" if args.tiny else "ace-step"
    preset = "tiny" if args.tiny else "published"
    model = build_denoiser(model_name, preset, seed=0, device=device, dtype=dtype)
    depth = args.depth
    frames = round(args.seconds * 25)
    engine = TorchEngine(
        model, max_batch=2 * depth, max_frames=frames, max_cond_len=64, mode=args.dit_mode
    )
    decoder = None
    if with_decoder:
        vae = build_vae(args.vae, seed=0, device=device, dtype=dtype)
        mode = args.modes[-1]
        window, batch = args.e2e_window or args.windows[0], args.e2e_batch or args.batches[0]
        chunk = args.chunk_frames[0] if mode.startswith("fused") else None
        dec_engine = _engine(OobleckAdapter(vae), mode, window, batch, chunk, args)
        # ``--decoder-stream tick``: decode on the ticks' own stream (no overlap, no contention)
        same = args.decoder_stream == "tick" and device.type == "cuda"
        decoder = AudioDecoder(dec_engine, window=window, crossfade=1, window_align=args.align,
                               max_windows_per_step=args.windows_per_step,
                               stream=torch.cuda.current_stream(device) if same else None)  # fmt: skip
    session = StreamSession(
        model, engine, depth=depth, max_queue=4 * args.requests, decoder=decoder
    )
    gen = torch.Generator().manual_seed(0)
    cond_len = 4 if args.tiny else 64

    def request(i: int) -> Request:
        extra = {"cfg_type": "full", "guidance": 4.0} if cfg else {}
        return Request(
            frames=frames, cond=torch.randn(cond_len, model.cond_dim, generator=gen), seed=i,
            steps=8, shift=3.0, **extra,
        )  # fmt: skip

    # ``--dit-priority high``: the ticks on a high-priority stream, so the decoder's kernels
    # (on the default-priority stream of the decoder stage) take the SMs the DiT leaves idle
    high = args.dit_priority == "high" and device.type == "cuda"
    stream = torch.cuda.Stream(device, priority=-1) if high else None

    def run(n: int) -> float:
        context = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with context:
            return _timed(n)

    def _timed(n: int) -> float:
        handles = [session.submit(request(i)) for i in range(n)]
        synchronize(device)
        start = time.perf_counter()
        session.run_until_idle()
        synchronize(device)
        elapsed = time.perf_counter() - start
        assert all(h.result is not None for h in handles)
        if with_decoder:
            assert all(h.audio_done for h in handles)
        return elapsed

    run(depth)  # captures, compiles, first decodes
    # the same session again for each repeat: the median run (machines' clocks drift)
    runs = sorted(run(args.requests) for _ in range(args.e2e_repeats))
    elapsed = runs[len(runs) // 2]
    return {
        "completions_per_s": args.requests / elapsed,
        "ms_per_completion": 1e3 * elapsed / args.requests,
        "completions_per_s_each": [args.requests / r for r in runs],
        "ticks": session.ticks,
        "decoder_calls": decoder.calls if decoder is not None else 0,
    }


def _e2e_records(args, device, dtype, env) -> list[BenchRecord]:
    records = []
    for cfg in [c == "on" for c in args.e2e_cfg.split(",")]:
        name = f"e2e_{args.seconds:g}s[{'cfg' if cfg else 'nocfg'}]"
        try:
            alone = _e2e(args, device, dtype, cfg, with_decoder=False)
            both = _e2e(args, device, dtype, cfg, with_decoder=True)
        except Exception as exc:
            print(f"{name}: {type(exc).__name__}: {exc}", flush=True)
            continue
        added = both["ms_per_completion"] / alone["ms_per_completion"] - 1.0
        records.append(
            BenchRecord(
                name=name,
                shape={"model": "dit/tiny" if args.tiny else "ace-step/published",
                       "seconds": args.seconds, "depth": args.depth, "steps": 8, "shift": 3.0,
                       "cfg": cfg, "requests": args.requests, "dit_engine": args.dit_mode,
                       "dit_priority": args.dit_priority, "chunk_frames": args.chunk_frames[0],
                       "decoder_stream": args.decoder_stream,
                       "windows_per_step": args.windows_per_step,
                       "decoder": f"{args.modes[-1]},w{args.e2e_window or args.windows[0]},"
                                  f"b{args.e2e_batch or args.batches[0]}"},
                baseline="the same session without the decoder (tick loop alone)",
                baseline_ms=alone["ms_per_completion"],
                ours_ms=both["ms_per_completion"],
                env=env,
                extra={
                    "completions_per_s": both["completions_per_s"],
                    "completions_per_s_without_decode": alone["completions_per_s"],
                    "decode_fraction_added": added,
                    "target": "decode adds <= 15%",
                    "reached": added <= 0.15,
                    "demon_completions_per_s": DEMON_COMPLETIONS_PER_S,
                    "demon_gpu": "RTX 5090 (not this GPU)",
                    "with_decoder": both,
                    "without_decoder": alone,
                },
            )
        )  # fmt: skip
        each = ", ".join(f"{c:.2f}" for c in both["completions_per_s_each"])
        print(f"{name}: {both['completions_per_s']:.2f} completions/s with decode ({each}), "
              f"{alone['completions_per_s']:.2f} without (+{100 * added:.1f}%)", flush=True)  # fmt: skip
    return records


def _ints(value: str) -> list[int]:
    return [int(v) for v in value.split(",") if v.strip()]


def main() -> None:
    parser = benchmark_arguments(__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny models on the host (seconds)")
    parser.add_argument("--seconds", type=float, default=None, help="audio length (default 60)")
    parser.add_argument("--vae", default=None, help="VAE preset (default ace-step; tiny)")
    parser.add_argument(
        "--modes",
        default=None,
        help="decoder modes (default eager,compile-graphs,fused-graphs; the last runs end to end)",
    )
    parser.add_argument("--windows", default="128,256", help="window lengths in frames")
    parser.add_argument("--batches", default="2,1", help="windows per decoder call")
    parser.add_argument(
        "--align", type=int, default=16,
        help="window lengths shortened to multiples of this (0: full windows)",
    )  # fmt: skip
    parser.add_argument(
        "--chunk-frames", default="",
        help="the fused decoder's chunk_frames, comma-separated (default: its default)",
    )  # fmt: skip
    parser.add_argument(
        "--dit-priority", choices=("default", "high"), default="default",
        help="run the end-to-end ticks on a high-priority CUDA stream",
    )  # fmt: skip
    parser.add_argument(
        "--decoder-stream", choices=("own", "tick"), default="own",
        help="end to end: decode on the decoder's own stream (overlapping the ticks) or on theirs",
    )  # fmt: skip
    parser.add_argument("--windows-per-step", type=int, default=None,
                        help="end to end: the decoder's max_windows_per_step (default: all)")
    parser.add_argument("--e2e-cfg", default="off,on", help="end to end without / with CFG")
    parser.add_argument("--e2e-repeats", type=int, default=1,
                        help="timed end-to-end runs per session (the median is reported)")
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--requests", type=int, default=None, help="timed e2e requests")
    parser.add_argument("--dit-mode", default=None, help="DiT engine mode (default graphs)")
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument("--skip-decode", action="store_true", help="the end-to-end runs alone")
    parser.add_argument("--e2e-window", type=int, default=None, help="default: first of --windows")
    parser.add_argument("--e2e-batch", type=int, default=None, help="default: first of --batches")
    parser.add_argument(
        "--cudnn-benchmark", action="store_true",
        help="let cuDNN time its convolution algorithms per shape (the full decode's too)",
    )  # fmt: skip
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    device = torch.device("cpu" if args.tiny else args.device)
    on_gpu = device.type == "cuda"
    if not on_gpu and not args.tiny:
        raise SystemExit("the full benchmark needs CUDA; use --tiny on the host")
    args.seconds = args.seconds or (2.0 if args.tiny else 60.0)
    args.vae = args.vae or ("tiny" if args.tiny else "ace-step")
    default_modes = "eager" if args.tiny else "eager,compile-graphs,fused-graphs"
    args.modes = (args.modes or default_modes).split(",")
    args.windows = _ints("32" if args.tiny and args.windows == "128,256" else args.windows)
    args.batches = _ints("2" if args.tiny and args.batches == "2,1" else args.batches)
    args.chunk_frames = _ints(args.chunk_frames) or [None]
    args.requests = args.requests or (2 if args.tiny else 32)
    args.dit_mode = args.dit_mode or ("eager" if args.tiny else "graphs")
    if args.tiny:
        args.depth = min(args.depth, 2)
    dtype = torch.bfloat16 if on_gpu else torch.float32
    env = environment(device)
    records = [] if args.skip_decode else _decode_records(args, device, dtype, env)
    if not args.skip_e2e:
        records += _e2e_records(args, device, dtype, env)
    report(records, args.out, meta={"command": " ".join(sys.argv), "args": vars(args)})


if __name__ == "__main__":
    main()
