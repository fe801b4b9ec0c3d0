"""Warm-up: compile every kernel a quantizer step at the named shapes needs, before the first step.

A shape is ``"BxKxD"`` (rows, codes per codebook, vector size: one codebook, what
:class:`~vq_kernels.VectorQuantizer` runs) or ``"BxKxDxL"`` (``L`` residual levels, what
:class:`~vq_kernels.ResidualVQ` runs), with optional flags after a colon, comma separated:

* ``bf16`` / ``fp16`` / ``fp32`` — the inputs' dtype (instead of the ``dtype`` argument);
* ``cosine`` — the cosine-similarity search (``metric="cosine"``) instead of L2;
* ``infer`` — inference only: the nearest-code search :func:`~vq_kernels.quantize` of the rows in
  the first codebook and the module's eval-mode forward, no backward and no EMA update.

Without ``infer`` a shape runs one training step of an EMA ``ResidualVQ(D, K, L)`` on ``B`` rows,
as ``benchmarks/rvq_step.py`` builds it: the residual search with its losses and straight-through
output, the backward, and the in-place EMA codebook update (:func:`~vq_kernels.ema_update_`, as the
module calls it). A tuple ``(B, K, D)`` or ``(B, K, D, L)`` of ints is the same shape without flags.

Examples: ``"640x256x64x3"`` (the step of ``benchmarks/rvq_step.py``), ``"65536x1024x128x8:bf16"``
(an audio-codec RVQ in bf16), ``"64x16384x8:infer"`` (tokenising a small batch with a large
low-dimensional codebook).

``TUNING_SHAPES`` are the regimes ``python -m triton_dispatch.tune vq_kernels`` measures. The
kernels choose their config by shape regime: the fused residual search by codebook-size bucket,
vector-size bucket, metric, precision and dtype (not by row count or level count); the one-level
search (:func:`~vq_kernels.quantize`, and the per-level path a small batch with a large codebook
takes) also by the row-count bucket and the number of K splits. The EMA update launches fixed,
shape-derived blocks (nothing to tune, but its kernels still compile on the first step).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import torch

from triton_dispatch.warmup import WarmupReport, run_warmup

from .modules import ResidualVQ
from .ops.quantize import quantize

FLAGS = ("bf16", "fp16", "fp32", "cosine", "infer")

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

#: The regimes the tuning command measures, each in fp32 and bf16 where training runs both. A
#: regime's first shape in this list is the one it is measured at (the fused search does not key
#: on the row count), so the 65536-row shapes come first: there the search is milliseconds long
#: and the config matters; 640 rows is the step of ``benchmarks/rvq_step.py``.
TUNING_SHAPES: list[str] = [
    # training steps: fused residual search + backward + EMA update
    "65536x256x64x3",  # RVQ, 256 codes x 64 dims (the rvq_step benchmark's codebooks)
    "65536x256x64x3:bf16",
    "640x256x64x3",  # the step of benchmarks/rvq_step.py, whose first call is the cold-start target
    "640x256x64x3:bf16",
    "65536x1024x64x3",  # 1024-code codebooks
    "65536x1024x64x3:bf16",
    "65536x1024x128x8",  # audio-codec RVQ (8 levels of 1024 codes x 128 dims)
    "65536x1024x128x8:bf16",
    "16384x1024x256",  # image VQ (one codebook, 256 dims)
    "16384x1024x256:bf16",
    "65536x16384x8:bf16",  # a large low-dimensional codebook (one level)
    "65536x256x64x3:cosine",
    "640x4096x64x3",  # small batch, large codebooks: the per-level search with K splits
    # inference: the one-level nearest-code search by row bucket and K split
    "65536x1024x128:infer",
    "65536x1024x128:infer,bf16",
    "1024x1024x128:infer",
    "64x1024x128:infer",
    "64x16384x8:infer,bf16",
]

_SHAPE = re.compile(r"^(\d+)x(\d+)x(\d+)(?:x(\d+))?(?::([a-z0-9,]+))?$")
_NOTATION = "'BxKxD[xL][:flag,...]' (rows x codes x dim [x levels], e.g. '640x256x64x3')"


def parse_shape(spec: str | Sequence[int]) -> tuple[tuple[int, int, int, int], frozenset[str]]:
    """``((rows, codes, dim, levels), flags)`` of one warm-up shape (see the module docstring)."""
    if isinstance(spec, str):
        match = _SHAPE.match(spec.strip().lower())
        if match is None:
            raise ValueError(f"shapes: {spec!r} is not {_NOTATION}")
        sizes = (*(int(g) for g in match.groups()[:3]), int(match.group(4) or 1))
        flags = frozenset(f for f in (match.group(5) or "").split(",") if f)
    else:
        try:
            values = tuple(spec)
        except TypeError:
            values = ()
        if len(values) not in (3, 4) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in values
        ):
            raise ValueError(f"shapes: {spec!r} is not (rows, codes, dim[, levels]) of ints")
        sizes, flags = values + ((1,) if len(values) == 3 else ()), frozenset()
    if min(sizes) <= 0:
        raise ValueError(f"shapes: every size must be positive, got {spec!r}; expected {_NOTATION}")
    unknown = flags - set(FLAGS)
    if unknown:
        raise ValueError(f"shapes: unknown flags {sorted(unknown)} in {spec!r}; known: {FLAGS}")
    if len(flags & set(_DTYPES)) > 1:
        raise ValueError(f"shapes: {spec!r} names more than one dtype")
    return sizes, flags  # type: ignore[return-value]


def _call(sizes, flags, device, dtype, backward: bool) -> Callable[[], object]:
    rows, codes, dim, levels = sizes
    dtype = next((_DTYPES[f] for f in flags if f in _DTYPES), dtype)
    metric = "cosine" if "cosine" in flags else "l2"
    # the module draws its codebooks from the global CPU generator: leave the caller's stream as
    # it was (the restart draws of the EMA update take their own generator)
    with torch.random.fork_rng(devices=[]):
        module = ResidualVQ(
            dim,
            codes,
            levels,
            metric=metric,
            generator=torch.Generator(device=device).manual_seed(0),
        ).to(device)
    x = torch.randn(rows, dim, generator=torch.Generator().manual_seed(0))
    x = x.to(device=device, dtype=dtype)

    if "infer" in flags:
        module.eval()

        def infer():
            with torch.no_grad():
                quantize(x, module.codebook[0], metric=metric)
                module(x)

        return infer

    def step():
        xi = x.detach().requires_grad_(backward)
        with torch.set_grad_enabled(backward):
            out = module(xi)  # in training mode the forward ends with the EMA update
            if backward:
                (out.quantized.float().square().mean() + out.loss).backward()

    return step


def warmup(
    shapes: Sequence[str | Sequence[int]] | str | None = None,
    *,
    device: torch.device | str = "cuda",
    dtype: torch.dtype = torch.float32,
    backward: bool = True,
    workers: int = 1,
) -> WarmupReport:
    """Run a quantizer step once at each shape so its kernels are compiled before the first one.

    Args:
        shapes: ``"BxKxD[xL][:flags]"`` strings or ``(B, K, D[, L])`` tuples (module docstring);
            ``None`` warms :data:`TUNING_SHAPES`.
        device: where the real steps will run (``"cpu"`` runs the reference path, or the
            interpreter under ``TRITON_INTERPRET=1``).
        dtype: the inputs' dtype for shapes without a dtype flag (the codebooks stay fp32, as in
            the modules).
        backward: also run the backward pass of training shapes; ``False`` runs their forward
            (with the EMA update) under ``torch.no_grad()``.
        workers: shapes warmed at once on threads (kernels of different shapes compile side by
            side).

    Returns:
        a :class:`~triton_dispatch.warmup.WarmupReport` (seconds, calls, kernels compiled).

    Each shape's inputs are small random tensors of exactly that shape on ``device``; the caller's
    random streams are left as they were.
    """
    if isinstance(shapes, str):
        shapes = [shapes]
    parsed = [parse_shape(s) for s in (TUNING_SHAPES if shapes is None else shapes)]
    calls = [_call(sizes, flags, device, dtype, backward) for sizes, flags in parsed]
    return run_warmup(calls, workers=workers, device=device)


__all__ = ["FLAGS", "TUNING_SHAPES", "parse_shape", "warmup"]
