"""The fused Oobleck decoder on the GPU (ACE-Step 1.5's VAE, two windows of 146 frames): its
bf16 error and diffusers' bf16 error against a float32 decode, eager and CUDA-graph time per 60 s
of audio, and the time and TFLOP/s of every layer. Writes ``$OUT/fused_probe.json``.

    PYTHONPATH=shared/triton-dispatch/src:packages/stream-dit/src python3 tools/gpu/fused_decode_probe.py
"""

from __future__ import annotations

import json
import os
import warnings

import torch
from triton.testing import do_bench

from stream_dit.decode.fused import FusedOobleck
from stream_dit.decode.oobleck import OobleckAdapter, build_vae
from stream_dit.ops.snake_conv import snake_conv

warnings.filterwarnings("ignore", category=FutureWarning)
B, L = 2, 146
PER_60S = 1500 / (L - 18) / B  # calls per 60 s of audio (9 frames of context on each side)


def layer_calls(fused: FusedOobleck, z: torch.Tensor) -> list[tuple]:
    """``(kind, layer, input, residual)`` of every launch of one decode."""
    calls = []
    x = act = z.transpose(1, 2).contiguous()
    for kind, layer, second in fused._layers:
        if kind == "in":
            calls.append((kind, layer, x, None))
            _, act = snake_conv(x, layer)
        elif kind == "up":
            calls.append((kind, layer, act, None))
            x, act = snake_conv(act, layer)
        elif second is None and kind == "unit":
            calls.append((kind, layer, act, x))
            x, act = snake_conv(act, layer, residual=x)
        elif kind == "unit":
            calls.append(("unit-conv", layer, act, None))
            _, hidden = snake_conv(act, layer)
            calls.append(("unit-1x1", second, hidden, x))
            x, act = snake_conv(hidden, second, residual=x)
        else:
            calls.append((kind, layer, act, None))
    return calls


def main() -> None:
    out: dict = {"B": B, "L": L}
    exact = OobleckAdapter(build_vae("ace-step", device="cuda", dtype=torch.float32))
    adapter = OobleckAdapter(build_vae("ace-step", device="cuda", dtype=torch.bfloat16))
    fused = FusedOobleck(adapter)
    z = torch.randn(B, 64, L, device="cuda")
    zb = z.bfloat16()
    with torch.no_grad(), torch.backends.cudnn.flags(allow_tf32=False):
        ref = exact(z)
        peak = ref.abs().max()
        out["bf16_fused_err"] = float((fused(zb).float() - ref).abs().max() / peak)
        out["bf16_adapter_err"] = float((adapter(zb).float() - ref).abs().max() / peak)
    with torch.no_grad():
        out["adapter_ms_per_60s"] = do_bench(lambda: adapter(zb), warmup=10, rep=100) * PER_60S
        out["fused_ms_per_60s"] = do_bench(lambda: fused(zb), warmup=10, rep=100) * PER_60S
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fused(zb)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fused(zb)
        out["fused_graph_ms_per_60s"] = do_bench(graph.replay, warmup=10, rep=100) * PER_60S
        layers = []
        for kind, layer, inp, res in layer_calls(fused, zb):
            rows = inp.shape[0] * inp.shape[1]
            flops = 2 * rows * layer.taps * layer.in_channels * layer.phases * layer.out_channels
            if layer.pointwise is not None:
                flops += 2 * rows * layer.out_channels**2
            if layer.head is not None:  # the decoder's last convolution, folded in
                flops += 2 * rows * layer.out_channels * layer.head.weight[0].numel()
                kind = "unit+head"
            ms = do_bench(lambda a=inp, w=layer, r=res: snake_conv(a, w, residual=r), rep=30)
            layers.append({"kind": kind, "in": layer.in_channels, "out": layer.out_channels,
                           "phases": layer.phases, "rows": inp.shape[1], "ms_per_60s": ms * PER_60S,
                           "tflops": flops / ms / 1e9})  # fmt: skip
        out["layers"] = layers
    folder = os.environ.get("OUT", "/tmp")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "fused_probe.json"), "w") as f:
        json.dump(out, f, indent=1)
    for key, value in out.items():
        for row in value if key == "layers" else [(key, value)]:
            print(row)


if __name__ == "__main__":
    main()
