"""HTTP front of a session (``stream-dit serve``): JSON in, ``.npy`` bytes out.

Needs the ``serve`` extra (FastAPI and uvicorn). ``POST /generate`` takes a JSON request (unknown
fields and non-finite numbers are refused with 422, requests beyond the engine's limits with 400,
both with the reason) and answers with the finished ``(frames, channels)`` float32 latent as the
bytes of a ``.npy`` file. ``GET /health`` reports the session's occupancy.
"""

from __future__ import annotations

import io
from contextlib import asynccontextmanager
from typing import Literal

import numpy as np
import torch
from fastapi import FastAPI, HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from .aio import AsyncStreamSession, RequestFailed
from .request import Request
from .session import StreamSession


class GenerateBody(BaseModel):
    """The JSON body of ``POST /generate``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    frames: int = Field(ge=1)
    cond: list[list[float]] | None = None
    cond_seed: int | None = Field(
        default=None, description="draw (cond_len, D) states from this seed instead of sending them"
    )
    cond_len: int = Field(default=8, ge=0)
    negative: list[list[float]] | None = None
    seed: int = 0
    steps: int = Field(default=8, ge=1, le=1000)
    shift: float = 1.0
    denoise: float = 1.0
    guidance: float = 1.0
    cfg_type: Literal["none", "full", "self", "initialize"] = "none"
    guidance_mode: Literal["cfg", "apg"] = "cfg"
    cfg_rescale: float = 0.0
    velocity_scale: list[float] | None = None
    noise: list[float] | None = None
    guidance_curve: list[float] | None = None
    dcw: tuple[float, float] | None = None


def _states(rows: list[list[float]], name: str) -> torch.Tensor:
    try:
        t = torch.tensor(rows, dtype=torch.float32)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{name} must be a rectangular list of lists of numbers: {exc}") from None
    return t.reshape(0, t.shape[-1] if t.dim() == 2 else 0) if t.numel() == 0 else t


def to_request(body: GenerateBody, cond_dim: int) -> Request:
    if body.cond is not None:
        cond = _states(body.cond, "cond")
    elif body.cond_seed is not None:
        cond = torch.randn(
            body.cond_len, cond_dim, generator=torch.Generator().manual_seed(body.cond_seed)
        )
    else:
        raise ValueError("give cond (a list of L rows of D numbers) or cond_seed")
    fields = body.model_dump(exclude={"cond", "cond_seed", "cond_len", "negative"})
    neg = _states(body.negative, "negative") if body.negative is not None else None
    return Request(cond=cond, negative=neg, **fields)


def npy_bytes(x: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x.detach().float().cpu().numpy())
    return buf.getvalue()


def create_app(session: StreamSession) -> FastAPI:
    """A FastAPI app serving ``session``; the driver starts and stops with the app's lifespan."""
    driver = AsyncStreamSession(session)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with driver:
            yield

    app = FastAPI(title="stream-dit", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request, exc: RequestValidationError) -> JSONResponse:
        # the default handler echoes the input back, which fails to encode for NaN/inf
        reasons = [
            {
                "field": ".".join(str(p) for p in err.get("loc", ()) if p != "body"),
                "reason": err.get("msg", ""),
            }
            for err in exc.errors()
        ]
        return JSONResponse(status_code=422, content={"detail": reasons})

    @app.post("/generate")
    async def generate(body: GenerateBody) -> Response:
        try:
            request = to_request(body, session.cond_dim)
            latent = await driver.generate(request)
        except (ValueError, TypeError) as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None
        except RequestFailed as exc:
            raise HTTPException(status_code=500, detail=str(exc)) from None
        return Response(content=npy_bytes(latent), media_type="application/octet-stream")

    @app.get("/health")
    async def health() -> dict:
        return {
            "active": session.active,
            "queued": session.queued,
            "depth": session.depth,
            "ticks": session.ticks,
        }

    return app
