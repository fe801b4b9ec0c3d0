import asyncio

import pytest
import torch

from stream_dit import Request, StreamSession
from stream_dit.aio import AsyncStreamSession


def _req(seed, **kw):
    gen = torch.Generator().manual_seed(seed)
    kw.setdefault("steps", 3)
    return Request(frames=8, cond=torch.randn(3, 32, generator=gen), seed=seed, **kw)


def test_generate_many_concurrently_matches_sync_session(tiny_model):
    async def main():
        async with AsyncStreamSession(StreamSession(tiny_model, depth=2, max_queue=2)) as driver:
            return await asyncio.gather(*(driver.generate(_req(i)) for i in range(5)))

    results = asyncio.run(main())
    ref = StreamSession(tiny_model, depth=1)
    for i, got in enumerate(results):
        h = ref.submit(_req(i))
        ref.run_until_idle()
        torch.testing.assert_close(got, h.result, rtol=1e-5, atol=1e-5)


def test_stream_yields_every_step_and_bad_requests_fail_alone(tiny_model):
    async def main():
        async with AsyncStreamSession(StreamSession(tiny_model, depth=2)) as driver:
            good = asyncio.ensure_future(driver.generate(_req(1)))
            with pytest.raises(ValueError, match="finite"):
                await driver.generate(_req(2, noise=[float("nan")]))
            steps = [x async for x in driver.stream(_req(3, steps=4))]
            return steps, await good

    steps, good = asyncio.run(main())
    assert len(steps) == 4 and torch.isfinite(good).all()
