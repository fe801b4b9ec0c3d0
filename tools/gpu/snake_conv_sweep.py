"""Tile sweep of the fused Oobleck decoder's heaviest layers (ACE-Step 1.5's VAE, bf16, two
windows of 146 frames): each layer under a grid of tiles and load cache modifiers, and the
128-channel residual unit fused against split in two launches. Writes $OUT/snake_conv_sweep.json.

    python3 tools/gpu/snake_conv_sweep.py
"""

import dataclasses
import json
import os
import time

import torch
from triton.testing import do_bench

import stream_dit.ops.snake_conv as sc
import stream_dit.ops.snake_conv.plan as scp
from stream_dit.decode.fused import FusedOobleck
from stream_dit.decode.oobleck import OobleckAdapter, build_vae
from triton_dispatch.launch import clear_plan_caches

B, L = 2, 146
per60 = 1500 / (L - 18) / B
ad = OobleckAdapter(build_vae("ace-step", device="cuda", dtype=torch.bfloat16))
f = FusedOobleck(ad)
z = torch.randn(B, 64, L, device="cuda", dtype=torch.bfloat16)
calls = []
with torch.no_grad():
    x = act = z.transpose(1, 2).contiguous()
    for kind, layer, second in f._layers:
        if kind == "unit" and second is None:
            calls.append((kind, layer, act, x))
            x, act = sc.snake_conv(act, layer, residual=x)
        elif kind == "unit":
            calls.append(("unita", layer, act, None))
            _, h = sc.snake_conv(act, layer)
            calls.append(("unitb", second, h, x))
            x, act = sc.snake_conv(h, second, residual=x)
        elif kind == "up":
            calls.append((kind, layer, act, None))
            x, act = sc.snake_conv(act, layer)
        elif kind == "in":
            calls.append((kind, layer, x, None))
            _, act = sc.snake_conv(x, layer)
        else:
            calls.append((kind, layer, act, None))


def sig(c):
    kind, layer, inp, _ = c
    return (kind, layer.in_channels, layer.out_channels, layer.phases, inp.shape[1])


wanted = {
    ("unit", 128, 128, 1, 280320),
    ("unit", 128, 128, 1, 140160),
    ("up", 128, 128, 2, 140160),
    ("unitb", 512, 512, 1, 8760),
    ("unita", 256, 256, 1, 35040),
    ("unitb", 256, 256, 1, 35040),
    ("up", 256, 128, 4, 35040),
}
base = scp.launch_config


def timed(layer, inp, res, tiles):
    scp.launch_config = (lambda *a: tiles) if tiles is not None else base
    clear_plan_caches()  # a plan binds its tiles: each setting plans afresh
    try:
        with torch.no_grad():
            return (
                do_bench(lambda: sc.snake_conv(inp, layer, residual=res), warmup=3, rep=15) * per60
            )
    except Exception:
        return float("inf")
    finally:
        scp.launch_config = base


GRID = [
    (bm, bk, w, s)
    for bm, w, s in ((64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 8, 3), (128, 8, 4), (256, 8, 3))
    for bk in (64, 128)
]
out = {"layers": []}
t0 = time.time()
seen = set()
with torch.no_grad():
    for c in calls:
        s_ = sig(c)
        if s_ not in wanted or s_ in seen:
            continue
        seen.add(s_)
        kind, layer, inp, res = c
        n = layer.phases * layer.out_channels
        whole = layer.pointwise is not None or layer.head is not None
        cin_p = scp.padded_size(layer.in_channels, 64)
        bn = max(16, 1 << (n - 1).bit_length()) if whole else min(128, scp.padded_size(n, 128))
        rows = {}
        default = timed(layer, inp, res, None)
        for bm, bk, w, st in GRID:
            if bk > cin_p:
                continue
            rows[f"bm{bm} bk{bk} w{w} s{st}"] = timed(layer, inp, res, scp.Tiles(bm, bn, bk, w, st))
        best = min(rows, key=rows.get)
        bm, bk, w, st = (int(p[2:] if p.startswith(("bm", "bk")) else p[1:]) for p in best.split())
        for cache in ((".ca", ""), (".ca", ".ca"), ("", ".ca")):
            rows[best + f" cache{cache}"] = timed(
                layer, inp, res, scp.Tiles(bm, bn, bk, w, st, *cache)
            )
        top = sorted(rows.items(), key=lambda kv: kv[1])[:6]
        rec = dict(sig=list(s_), default_ms60=default, top=top, elapsed=time.time() - t0)
        if kind == "unit":  # the same unit split in two launches
            pw = layer.pointwise
            first = dataclasses.replace(
                sc.prepare_snake_conv(
                    layer.weight,
                    layer.bias,
                    dilation=layer.dilation,
                    padding=layer.padding,
                    out_snake=pw.snake,
                    store_out=False,
                )
            )
            second = sc.prepare_snake_conv(pw.weight[None], pw.bias, out_snake=layer.out_snake)
            _, h = sc.snake_conv(inp, first)
            split = {}
            for bm, bk, w, st in GRID:
                split[f"a bm{bm} bk{bk} w{w} s{st}"] = timed(
                    first, inp, None, scp.Tiles(bm, 128, bk, w, st)
                )
                if bk == 64:
                    split[f"b bm{bm} w{w} s{st}"] = timed(
                        second, h, res, scp.Tiles(bm, 128, 64, w, st)
                    )
            a = min((v, k) for k, v in split.items() if k.startswith("a"))
            b = min((v, k) for k, v in split.items() if k.startswith("b"))
            rec["split_best"] = (a, b, a[0] + b[0])
        out["layers"].append(rec)
        print(json.dumps(rec), flush=True)
        if time.time() - t0 > 360:
            break
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)

folder = os.environ.get("OUT", "/tmp")
os.makedirs(folder, exist_ok=True)
with open(os.path.join(folder, "snake_conv_sweep.json"), "w") as f:
    json.dump(out, f, indent=1)
