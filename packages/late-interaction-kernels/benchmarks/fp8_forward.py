"""FP8 MaxSim inference against our bf16 forward, with top-10 agreement on normalised embeddings.

    python3 packages/late-interaction-kernels/benchmarks/fp8_forward.py --out fp8.json [--quick]

Shapes (Nq, Nd, Lq, Ld, d): corpus scoring (1, 10000, 32, 300) and ColPali reranking
(1, 1000, 128, 1024), d = 128. The baseline is ``maxsim`` on the bf16 embeddings; ours is
``maxsim_inference_fp8`` on e4m3 copies with per-tensor and with per-token scales (quantisation
is done once, outside the timing, as an index would store it). Targets: >= 1.6x the bf16 forward,
top-10 overlap >= 0.99 against bf16 (``extra.top10_overlap``). Needs compute capability 8.9+.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from late_interaction_kernels import maxsim
from late_interaction_kernels.fp8 import (
    maxsim_inference_fp8,
    quantize_fp8_per_tensor,
    quantize_fp8_per_token,
)
from triton_dispatch.bench import benchmark_arguments, compare, report

CASES = [("corpus", (1, 10000, 32, 300, 128)), ("colpali-rerank", (1, 1000, 128, 1024, 128))]
QUICK = [("corpus-small", (1, 1000, 32, 300, 128))]
TOP = 10


def overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean fraction of shared ids between the top-10 lists of each query."""
    ta, tb = a.topk(TOP, dim=1).indices, b.topk(TOP, dim=1).indices
    shared = (ta[:, :, None] == tb[:, None, :]).any(-1).float().mean(-1)
    return float(shared.mean())


def main() -> None:
    args = benchmark_arguments(__doc__.splitlines()[0]).parse_args()
    device = torch.device(args.device)
    records = []
    for name, (nq, nd, lq, ld, dim) in QUICK if args.quick else CASES:
        gen = torch.Generator().manual_seed(0)
        Q = F.normalize(torch.randn(nq, lq, dim, generator=gen), dim=-1).to(device, torch.bfloat16)
        D = F.normalize(torch.randn(nd, ld, dim, generator=gen), dim=-1).to(device, torch.bfloat16)
        shape = {"Nq": nq, "Nd": nd, "Lq": lq, "Ld": ld, "d": dim}
        with torch.no_grad():
            bf16 = maxsim(Q, D)
            for scales, quantize in (("per-tensor", quantize_fp8_per_tensor),
                                     ("per-token", quantize_fp8_per_token)):  # fmt: skip
                (Qq, sq), (Dq, sd) = quantize(Q), quantize(D)
                ours = lambda: maxsim_inference_fp8(Qq, Dq, scale_Q=sq, scale_D=sd)
                rec = compare(
                    f"fp8:{name}:{scales}", shape, ours=ours, baseline=lambda: maxsim(Q, D),
                    baseline_name="maxsim bf16", device=device,
                    extra={"top10_overlap": overlap(ours(), bf16), "target_speedup": 1.6,
                           "target_overlap": 0.99},
                )  # fmt: skip
                records.append(rec)
                print(f"{rec.name}: top-10 overlap {rec.extra['top10_overlap']:.4f}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report(records, args.out, meta={"script": "fp8_forward.py", "quick": args.quick})


if __name__ == "__main__":
    main()
