"""What one public ``maxsim(Q, D)`` call launches, kernel by kernel, beside its ``do_bench`` GPU
time and the forward kernel's: where a call's time above its kernel goes (extra launches, the
gaps between them), for the shapes where ``peers.py`` finds us behind a peer.

    python3 tools/gpu/maxsim_call_kernels.py --out call_kernels.json [--shapes 1x10000x32x300,...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
for src in ("shared/triton-dispatch/src", "packages/late-interaction-kernels/src"):
    sys.path.insert(0, str(ROOT / src))

DEFAULT = "1x10000x32x300,1x1000x32x300,32x32x32x300,1x1000x128x1024,1x100x32x300"


def main() -> None:
    import triton.testing
    from torch.profiler import ProfilerActivity, profile

    from late_interaction_kernels import maxsim

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "call_kernels.json"))
    ap.add_argument("--shapes", default=DEFAULT)
    args = ap.parse_args()
    rows = []
    for text in args.shapes.split(","):
        nq, nd, lq, ld = (int(v) for v in text.split("x"))
        q = torch.randn(nq, lq, 128, device="cuda", dtype=torch.bfloat16)
        d = torch.randn(nd, ld, 128, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            for _ in range(3):
                maxsim(q, d)
            ms = triton.testing.do_bench(lambda q=q, d=d: maxsim(q, d), rep=200)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    maxsim(q, d)
                torch.cuda.synchronize()
        kernels: dict[str, list[float]] = {}
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                kernels.setdefault(event.name, []).append(event.device_time)
        listed = {name: {"per_call": len(times) / 20, "us": sum(times) / len(times)}
                  for name, times in kernels.items()}  # fmt: skip
        row = {"shape": text, "do_bench_ms": ms, "kernels": listed}
        print(text, f"{ms * 1e3:.1f} us per call;",
              "; ".join(f"{k[:60]} x{v['per_call']:.0f} {v['us']:.1f} us" for k, v in listed.items()),
              flush=True)  # fmt: skip
        rows.append(row)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows},
                                         indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
