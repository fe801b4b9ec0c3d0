"""Where one engine forward spends its time: per-op (CPU) or per-kernel (CUDA) self time, rolled
up into attention, GEMM, norm and pointwise."""

from __future__ import annotations

import re

import torch
from torch.profiler import ProfilerActivity, profile

CATEGORIES = ("attention", "gemm", "norm", "pointwise", "other")

_RULES = (
    ("attention", re.compile(r"attention|flash|fmha|sdpa|softmax", re.I)),
    (
        "gemm",
        re.compile(
            r"gemm|matmul|addmm|\bmm\b|aten::mm|aten::bmm|linear|cutlass|xmma|nvjet|cublas|sm\d+_",
            re.I,
        ),
    ),
    ("norm", re.compile(r"norm", re.I)),
    (
        "pointwise",
        re.compile(
            r"elementwise|vectorized|add|mul|gelu|silu|glu|rotary|copy|cat|fill|exp|sin|cos|div|sub|where|index|reduce|sum|mean|unrolled|pad|clone|contiguous|to_copy|tanh",
            re.I,
        ),
    ),
)

_CONTAINERS = re.compile(r"^aten::(linear|scaled_dot_product_attention|layer_norm)$")


def categorize(name: str) -> str:
    """The category of an op or kernel name."""
    for cat, rule in _RULES:
        if rule.search(name):
            return cat
    return "other"


def profile_forward(
    engine, rows: int, frames: int, cond_len: int, *, warmup: int = 3, top: int = 10
) -> dict:
    """Profile one ``engine.forward`` at a batch of ``rows`` and return ``{"total_ms", "by_category"
    (ms), "fractions", "top" (the ``top`` largest entries)}``."""
    device = engine.device
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, frames, engine.latent_channels, generator=gen).to(device)
    t = torch.rand(rows, generator=gen).to(device)
    states = torch.randn(rows, cond_len, engine.cond_dim, generator=gen).to(device)
    mask = torch.ones(rows, cond_len, dtype=torch.bool, device=device)
    for _ in range(warmup):
        engine.forward(x, t, states, mask)
    on_cuda = device.type == "cuda"
    if on_cuda:
        torch.cuda.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        engine.forward(x, t, states, mask)
        if on_cuda:
            torch.cuda.synchronize(device)
    totals = dict.fromkeys(CATEGORIES, 0.0)
    entries = []
    for ev in prof.key_averages():
        if on_cuda:
            us = getattr(ev, "self_device_time_total", 0.0) or getattr(
                ev, "self_cuda_time_total", 0.0
            )
            if not us or ev.key.startswith("aten::") or ev.key.startswith("cuda"):
                continue
        else:
            if not ev.key.startswith("aten::") or _CONTAINERS.match(ev.key):
                continue
            us = ev.self_cpu_time_total
        if us <= 0:
            continue
        cat = categorize(ev.key)
        totals[cat] += us / 1e3
        entries.append((us / 1e3, ev.key, cat))
    total = sum(totals.values())
    entries.sort(reverse=True)
    return {
        "total_ms": total,
        "by_category": totals,
        "fractions": {k: (v / total if total else 0.0) for k, v in totals.items()},
        "top": [{"ms": ms, "name": name[:120], "category": cat} for ms, name, cat in entries[:top]],
    }


def linear_flops(adapter: torch.nn.Module, *inputs) -> float:
    """FLOPs of every ``Linear`` and patch convolution (kernel = stride) of one forward of
    ``adapter`` on ``inputs``, counted by hooks on the modules (the reference forward runs
    them as modules; an adapter with a ``fused`` switch runs its reference blocks for the
    count). Attention's FLOPs are not included."""
    from torch import nn

    total = [0.0]

    def hook(module, args, out) -> None:
        if isinstance(module, nn.Linear):
            per_output = module.in_features
        elif isinstance(module, nn.Conv1d):  # (C_out, C_in, k): C_in·k products an output
            per_output = module.weight.shape[1] * module.weight.shape[2]
        else:  # ConvTranspose1d, kernel = stride: C_in products an output
            per_output = module.weight.shape[0]
        total[0] += 2.0 * out.numel() * per_output

    kinds = (nn.Linear, nn.Conv1d, nn.ConvTranspose1d)
    handles = [m.register_forward_hook(hook) for m in adapter.modules() if isinstance(m, kinds)]
    switch = hasattr(adapter, "fused")
    fused = getattr(adapter, "fused", None)
    try:
        if switch:
            adapter.fused = False
        with torch.no_grad():
            adapter(*inputs)
    finally:
        if switch:
            adapter.fused = fused
        for h in handles:
            h.remove()
    return total[0]


def dense_gemm_rate(device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> float:
    """The card's measured dense GEMM rate in TFLOP/s (``do_bench`` median of a 6000x2048 @
    2048x6144 product, the shape of a DiT's MLP at 8 rows of 750 tokens)."""
    import triton.testing

    a = torch.randn(6000, 2048, device=device, dtype=dtype)
    b = torch.randn(2048, 6144, device=device, dtype=dtype)
    ms = triton.testing.do_bench(lambda: a @ b, rep=300)
    return 2 * 6000 * 2048 * 6144 / ms / 1e9


def format_profile(result: dict) -> str:
    parts = [
        f"{k} {v:.3f} ms ({100 * result['fractions'][k]:.0f}%)"
        for k, v in result["by_category"].items()
        if v
    ]
    return f"forward {result['total_ms']:.3f} ms: " + ", ".join(parts)
