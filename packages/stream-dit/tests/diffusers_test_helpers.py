"""The GPU parity rail the diffusers adapters share: the published size in bf16 through a session
at depth 1, 4 and 8 against the diffusers model driven per request."""

from __future__ import annotations

from collections.abc import Callable

import torch

from stream_dit import Request, StreamSession, TorchEngine


def relative_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float().cpu(), b.detach().float().cpu()  # results come back on the host
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def check_bf16_session_parity(
    build: Callable[[torch.dtype], torch.nn.Module],
    reference: Callable[[torch.nn.Module, Request], torch.Tensor],
    make_requests: Callable[[int], list[Request]],
) -> None:
    """bf16 results depend on the batch (GEMM tiling), so the bound is relative to bf16's own
    error: each session result is within 3x the distance of the bf16 reference from fp32.
    ``build(dtype)`` makes the adapter on CUDA, ``make_requests(cond_dim)`` the requests."""
    fp32 = build(torch.float32)
    bf16 = build(torch.bfloat16)
    bf16.load_state_dict(fp32.state_dict())  # same weights, rounded
    requests = make_requests(bf16.cond_dim)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        exact = [reference(fp32, r) for r in requests]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    del fp32
    torch.cuda.empty_cache()
    ref = [reference(bf16, r) for r in requests]
    floor = [relative_distance(a, b) for a, b in zip(ref, exact)]
    for depth in (1, 4, 8):
        engine = TorchEngine(bf16, max_batch=2 * depth, max_frames=128, max_cond_len=32)
        session = StreamSession(bf16, engine, depth=depth, max_queue=len(requests))
        handles = [session.submit(Request(**r.__dict__)) for r in requests]
        session.run_until_idle()
        for h, want, f in zip(handles, ref, floor):
            assert h.result is not None and torch.isfinite(h.result).all()
            err = relative_distance(h.result, want)
            assert err <= 3 * f + 1e-3, (depth, err, f)
