"""FP8 GEMMs for ACE-Step 1.5's blocks (published size) on Hopper: ``torch._scaled_mm`` with
row-wise scales (e4m3 activations scaled per token, weights per output channel, bf16 out)
against cuBLAS's bf16 GEMM at 8 and 16 rows of 1500 frames, the relative error of each against
a float32 product, and what quantizing the activations with PyTorch ops costs.

    python3 tools/gpu/dit_fp8_gemms.py --out fp8_gemms.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

SHAPES = (("qkv", 4096, 2048), ("attn_out", 2048, 2048), ("gate_up", 12288, 2048),
          ("down", 2048, 6144))  # fmt: skip
E4M3_MAX = 448.0


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 rows and their float32 ``(rows, 1)`` scales (each row's max magnitude to 448)."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-12) / E4M3_MAX
    return (x.float() / scale).to(torch.float8_e4m3fn), scale


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "fp8_gemms.json"))
    args = ap.parse_args()
    rows = []
    for m in (6000, 12000):
        for name, n, k in SHAPES:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
            w8, w_scale = quantize_rows(w)
            x8, x_scale = quantize_rows(x)

            def fp8(x8=x8, w8=w8, x_scale=x_scale, w_scale=w_scale):
                return torch._scaled_mm(x8, w8.t(), scale_a=x_scale, scale_b=w_scale.t(),
                                        out_dtype=torch.bfloat16)  # fmt: skip

            flop = 2 * m * n * k
            bf16_ms = triton.testing.do_bench(lambda x=x, w=w: F.linear(x, w), rep=100)
            fp8_ms = triton.testing.do_bench(fp8, rep=100)
            quant_ms = triton.testing.do_bench(lambda x=x: quantize_rows(x), rep=100)
            exact = F.linear(x.float(), w.float())
            errors = {
                label: ((out.float() - exact).norm() / exact.norm()).item()
                for label, out in (("bf16", F.linear(x, w)), ("fp8", fp8()))
            }
            rows.append({"m": m, "gemm": name, "n": n, "k": k, "bf16_ms": bf16_ms,
                         "fp8_ms": fp8_ms, "torch_quantize_ms": quant_ms,
                         "rel_err": errors})  # fmt: skip
            print(f"M={m} {name:8s} bf16 {bf16_ms:.4f} ms ({flop / bf16_ms / 1e9:.0f} TFLOP/s) "
                  f"fp8 {fp8_ms:.4f} ms ({flop / fp8_ms / 1e9:.0f}) {bf16_ms / fp8_ms:.2f}x; "
                  f"quantizing x with torch ops {quant_ms:.4f} ms; error bf16 "
                  f"{errors['bf16']:.1e} fp8 {errors['fp8']:.1e}", flush=True)  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                          "rows": rows}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
