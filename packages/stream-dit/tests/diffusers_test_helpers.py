"""What the parity tests of the diffusers adapters share: their mixed requests, the session and
bucketed-engine runs of them, and the GPU rail (the published size in bf16 through a session at
depth 1, 4 and 8 against the diffusers model driven per request)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from stream_dit import Request, StreamSession, TorchEngine


def mixed_requests(
    seed: int, n: int, *, cfg: bool, cond_dim: int, context_channels: int = 0
) -> list[Request]:
    """Mixed frame counts (padded frames in every batch), masked and unmasked conditioning, and
    with ``context_channels`` context latents on every other request."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        frames = int(torch.randint(5, 29, (1,), generator=gen))
        length = int(torch.randint(1, 9, (1,), generator=gen))
        cond = torch.randn(length, cond_dim, generator=gen)
        mask = None
        if length > 2 and i % 3 == 1:
            mask = torch.rand(length, generator=gen) > 0.4
            mask[int(torch.randint(length, (1,), generator=gen))] = True
        ctx = None
        if context_channels and i % 2 == 0:
            ctx = torch.randn(frames, context_channels, generator=gen)
        kw = {}
        if cfg:
            kw = {"cfg_type": "full", "guidance": 1.5 + i % 4}
            if i % 4 == 3:  # an explicit negative prompt; otherwise the null condition
                kw["negative"] = torch.randn(length + 1, cond_dim, generator=gen)
        out.append(
            Request(
                frames=frames,
                cond=cond,
                cond_mask=mask,
                context=ctx,
                seed=(seed % 100_000) * 100 + i,
                steps=3 + i % 3,
                shift=3.0,
                **kw,
            )
        )
    return out


def session_results(adapter, requests, depth, **engine_kw) -> list[torch.Tensor]:
    """Every request through one session at ``depth`` (an engine of 32 frames, 16 states)."""
    engine = TorchEngine(adapter, max_batch=2 * depth, max_frames=32, max_cond_len=16, **engine_kw)
    session = StreamSession(adapter, engine, depth=depth, max_queue=len(requests))
    handles = [session.submit(Request(**r.__dict__)) for r in requests]
    session.run_until_idle()
    assert all(h.result is not None for h in handles), [h.error for h in handles]
    return [h.result for h in handles]


def bucketed_results(adapter, requests) -> list[torch.Tensor]:
    """The requests at depth 4 through an engine bucketing T, L and the batch as its compile and
    graphs modes do, run eagerly on the CPU."""
    engine = TorchEngine(adapter, max_batch=8, max_frames=64, max_cond_len=16)
    engine._bucketed = True
    session = StreamSession(adapter, engine, depth=4)
    handles = [session.submit(Request(**r.__dict__)) for r in requests]
    session.run_until_idle()
    return [h.result for h in handles]


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
