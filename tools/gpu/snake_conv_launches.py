"""Every distinct layer of the fused Oobleck decoder (ACE-Step 1.5's VAE, bf16, one window of 240
frames) alone, under the shipped launch, one program per tile (``grid``) and two programs per SM
walking the tiles (``walk2``): GPU ms per 60 s of audio (best of two interleaved rounds), and
each variant's largest difference from the shipped output (the same sums: 0). Writes ``$OUT/snake_conv_launches.json``.

    PYTHONPATH=shared/triton-dispatch/src:packages/stream-dit/src python3 tools/gpu/snake_conv_launches.py
"""

from __future__ import annotations

import json
import os

import torch
from fused_decode_probe import layer_calls  # this folder's per-layer probe
from triton.testing import do_bench

import stream_dit.ops.snake_conv.plan as plan
from stream_dit.decode.fused import FusedOobleck
from stream_dit.decode.oobleck import OobleckAdapter, build_vae
from stream_dit.ops.snake_conv import snake_conv
from triton_dispatch.launch import clear_plan_caches

FRAMES, CONTEXT, ROUNDS = 240, 9, 2
PER_60S = 1500 / (FRAMES - 2 * CONTEXT - 1)  # windows per 60 s (context on both sides, crossfade)
VARIANTS = {
    "shipped": None,
    "grid": lambda tiles: tiles._replace(persistent=0),
    "walk2": lambda tiles: tiles._replace(persistent=2),
}


def timed(layer, inp, res, change) -> tuple[float, torch.Tensor]:
    shipped = plan.launch_config
    plan.launch_config = (lambda *a: change(shipped(*a))) if change else shipped
    clear_plan_caches()  # a plan binds its tiles: each variant plans afresh
    try:
        out = next(t for t in snake_conv(inp, layer, residual=res) if t is not None and t.numel())
        ms = do_bench(lambda: snake_conv(inp, layer, residual=res), warmup=25, rep=100)
        return ms * PER_60S, out.float()
    finally:
        plan.launch_config = shipped


def main() -> None:
    adapter = OobleckAdapter(build_vae("ace-step", device="cuda", dtype=torch.bfloat16))
    fused = FusedOobleck(adapter, chunk_frames=None)
    z = torch.randn(1, 64, FRAMES, device="cuda", dtype=torch.bfloat16)
    records: dict[tuple, dict] = {}
    with torch.no_grad():
        for kind, layer, inp, res in layer_calls(fused, z):
            key = (kind, layer.in_channels, layer.out_channels, layer.phases, inp.shape[1])
            if key in records:
                records[key]["count"] += 1
                continue
            rec = dict(zip(("kind", "in", "out", "phases", "rows"), key), count=1)
            shipped_out = None
            for _ in range(ROUNDS):  # interleaved, best of the rounds: a layer alone is short
                for name, change in VARIANTS.items():
                    ms, out = timed(layer, inp, res, change)
                    rec[name] = min(rec.get(name, ms), ms)
                    if shipped_out is None:
                        shipped_out = out
                    elif name != "shipped":
                        peak = shipped_out.abs().max()
                        rec[f"{name}_diff"] = float((out - shipped_out).abs().max() / peak)
            records[key] = rec
            print(json.dumps(rec), flush=True)
    layers = list(records.values())
    total = {name: sum(r["count"] * r[name] for r in layers) for name in VARIANTS}
    print("total ms per 60 s:", json.dumps(total))
    folder = os.environ.get("OUT", "/tmp")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "snake_conv_launches.json"), "w") as f:
        json.dump({"frames": FRAMES, "layers": layers, "total": total}, f, indent=1)


if __name__ == "__main__":
    main()
