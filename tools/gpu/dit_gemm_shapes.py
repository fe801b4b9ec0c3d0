"""The GEMMs of one ACE-Step 1.5 block (published size, bf16) at 8 and 16 rows of 1500 frames:
cuBLAS's rate per shape, interleaved so every shape sees the same clocks, against the same
GEMM in two halves of rows and under ``preferred_blas_library("cublaslt")``.

    python3 tools/gpu/dit_gemm_shapes.py --out gemm_shapes.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

# (name, out features, in features) of one block: QKV, self-attention out, cross-attention query
# and out, gate/up, down
SHAPES = (("qkv", 4096, 2048), ("attn_out", 2048, 2048), ("cross_q", 2048, 2048),
          ("cross_out", 2048, 2048), ("gate_up", 12288, 2048), ("down", 2048, 6144))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gemm_shapes.json"))
    args = ap.parse_args()
    rows = []
    weights = {name: torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
               for name, n, k in SHAPES}  # fmt: skip
    for m in (6000, 12000):
        inputs = {k: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, _, k in SHAPES}
        for lib in ("cublas", "cublaslt"):
            torch.backends.cuda.preferred_blas_library(lib)
            for name, n, k in SHAPES:
                x, w = inputs[k], weights[name]
                flop = 2 * m * n * k
                whole = triton.testing.do_bench(lambda x=x, w=w: F.linear(x, w), rep=100)
                halves = triton.testing.do_bench(
                    lambda x=x, w=w: [F.linear(h, w) for h in x.chunk(2)], rep=100
                )
                rows.append({"m": m, "lib": lib, "gemm": name, "n": n, "k": k, "ms": whole,
                             "halves_ms": halves, "tflops": flop / whole / 1e9})  # fmt: skip
                print(f"M={m} {lib:8s} {name:9s} {whole:.4f} ms ({flop / whole / 1e9:.0f} "
                      f"TFLOP/s), in halves {halves:.4f} ms", flush=True)  # fmt: skip
    torch.backends.cuda.preferred_blas_library("cublas")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                          "rows": rows}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
