"""Warm-up: compile every kernel the named MaxSim shapes need before the first real call.

A shape is ``"NQxNDxLQxLD"`` (queries, documents, query tokens, document tokens) with an optional
``xDIM`` (default 128), and optional flags after a colon, comma separated:

* ``mask`` — with query and document token masks (padded batches);
* ``normalize`` — cosine similarities;
* ``lowmem`` / ``unified`` — that backward method instead of the automatic choice;
* ``pairs`` — each query against its own ``ND`` candidates (a 4-D ``(NQ, ND, LD, DIM)`` document
  tensor, what a reranker or a hard-negative loss passes) instead of every query against every
  document;
* ``topk`` — :func:`~late_interaction_kernels.topk.maxsim_topk` (top 10) instead of scores;
* ``fp8`` — FP8 inference scores with per-token scales (GPUs of compute capability 8.9+ only);
* ``infer`` — forward only.

Examples: ``"32x32x32x300"`` (an in-batch training step of 32 ColBERT queries),
``"1x1000x32x300:infer"`` (a rerank of 1000 candidates), ``"16x16x128x1024:mask"`` (ColPali
pages). ``TUNING_SHAPES`` are the regimes ``python -m triton_dispatch.tune late_interaction_kernels``
measures: the kernels key on the query-length bucket, the embedding width, the layout and the
flags (never on document counts or lengths), so a few shapes per query-length bucket cover them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import torch

from triton_dispatch.warmup import WarmupReport, run_warmup

from .ops.maxsim import maxsim_unchecked

FLAGS = ("mask", "normalize", "lowmem", "unified", "pairs", "topk", "fp8", "infer")

TUNING_SHAPES: list[str] = [
    # in-batch training (PyLate / ColBERT: short queries, passages up to 300 tokens)
    "32x32x32x300",
    "64x64x32x180",
    "32x32x32x300:mask",
    "32x32x32x300:lowmem",
    "16x16x16x128",
    "8x8x64x512",
    "16x16x128x1024",
    "16x16x128x1024:mask",
    "4x4x256x300",
    "32x32x20x77",
    "32x8x32x300:pairs",
    "32x8x32x300:pairs,mask",
    "32x32x32x300:normalize",
    "32x32x32x300x96",
    "32x32x32x300x64",
    # retrieval and reranking
    "1x1000x32x300:infer",
    "1x1000x32x1024:infer",
    "8x1000x32x300:infer",
    "1x1000x128x1024:infer",
    "1x1000x32x300:topk",
    "1x1000x32x1024:topk",
    "1x1000x32x300:fp8",
    "1x1000x32x1024:fp8",
]

_SHAPE = re.compile(r"^(\d+)x(\d+)x(\d+)x(\d+)(?:x(\d+))?(?::([a-z0-9,]+))?$")


def parse_shape(spec: str | Sequence[int]) -> tuple[tuple[int, int, int, int, int], frozenset[str]]:
    """``((nq, nd, lq, ld, dim), flags)`` of one warm-up shape (see the module docstring)."""
    if isinstance(spec, str):
        match = _SHAPE.match(spec.strip().lower())
        if match is None:
            raise ValueError(
                f"shapes: {spec!r} is not 'NQxNDxLQxLD[xDIM][:flag,...]' (e.g. '32x32x32x300')"
            )
        sizes = (*(int(g) for g in match.groups()[:4]), int(match.group(5) or 128))
        flags = frozenset(f for f in (match.group(6) or "").split(",") if f)
    else:
        values = tuple(spec)
        if len(values) not in (4, 5) or not all(isinstance(v, int) for v in values):
            raise ValueError(f"shapes: {spec!r} is not (nq, nd, lq, ld[, dim]) of ints")
        sizes, flags = values + ((128,) if len(values) == 4 else ()), frozenset()
    if min(sizes) <= 0:
        raise ValueError(f"shapes: every size must be positive, got {spec!r}")
    unknown = flags - set(FLAGS)
    if unknown:
        raise ValueError(f"shapes: unknown flags {sorted(unknown)} in {spec!r}; known: {FLAGS}")
    return sizes, flags  # type: ignore[return-value]


def _call(sizes, flags, device, dtype, backward: bool, inference: bool) -> Callable[[], object]:
    nq, nd, lq, ld, dim = sizes
    g = torch.Generator().manual_seed(0)
    doc_shape = (nq, nd, ld, dim) if "pairs" in flags else (nd, ld, dim)

    def rand(*shape):
        return torch.randn(shape, generator=g).to(device=device, dtype=dtype)

    Q, D = rand(nq, lq, dim), rand(*doc_shape)
    q_mask = d_mask = None
    if "mask" in flags:
        q_mask = torch.ones(nq, lq, dtype=torch.bool, device=device)
        q_mask[:, lq // 2 + 1 :] = False
        d_mask = torch.ones(doc_shape[:-1], dtype=torch.bool, device=device)
        d_mask[..., ld // 2 + 1 :] = False
    if "fp8" in flags:
        from .fp8 import maxsim_inference_fp8, quantize_fp8_per_token

        (q8, sq), (d8, sd) = quantize_fp8_per_token(Q), quantize_fp8_per_token(D)
        return lambda: maxsim_inference_fp8(q8, d8, scale_Q=sq, scale_D=sd)
    if "topk" in flags:
        from .topk import maxsim_topk

        return lambda: maxsim_topk(
            Q, D, min(10, nd), q_mask, d_mask, normalize="normalize" in flags
        )
    method = "lowmem" if "lowmem" in flags else "unified" if "unified" in flags else None
    train = backward and "infer" not in flags

    normalize = "normalize" in flags

    def step():
        if inference or not train:  # scoring without autograd keeps no argmax: its own variant
            with torch.no_grad():
                maxsim_unchecked(Q, D, q_mask, d_mask, normalize=normalize)
        if train:
            q, d = Q.detach().requires_grad_(), D.detach().requires_grad_()
            scores = maxsim_unchecked(q, d, q_mask, d_mask, normalize=normalize, backward=method)
            scores.sum().backward()

    return step


def warmup(
    shapes: Sequence[str | Sequence[int]] | None = None,
    *,
    device: torch.device | str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    backward: bool = True,
    inference: bool = True,
    workers: int = 1,
) -> WarmupReport:
    """Run MaxSim once at each shape so its kernels are compiled before the first real call.

    Args:
        shapes: ``"NQxNDxLQxLD[xDIM][:flags]"`` strings or ``(nq, nd, lq, ld[, dim])`` tuples
            (module docstring); ``None`` warms :data:`TUNING_SHAPES`.
        device, dtype: where and in what precision the real calls will run.
        backward: also run the backward pass (training), except for shapes flagged ``infer``,
            ``topk`` or ``fp8``.
        inference: also run the forward without autograd (evaluation scoring), which compiles
            a kernel variant of its own; ``False`` warms training steps only.
        workers: shapes warmed at once on threads (kernels of different shapes compile side by
            side).

    Returns:
        a :class:`~triton_dispatch.warmup.WarmupReport` (seconds, calls, kernels compiled).

    Shapes only need the same regime as the real calls: the kernels are chosen by query-length
    bucket, embedding width, layout and flags, so one document count and length stands for all.
    """
    if isinstance(shapes, str):
        shapes = [shapes]
    parsed = [parse_shape(s) for s in (TUNING_SHAPES if shapes is None else shapes)]
    calls = [_call(sizes, flags, device, dtype, backward, inference) for sizes, flags in parsed]
    return run_warmup(calls, workers=workers, device=device)


__all__ = ["FLAGS", "TUNING_SHAPES", "parse_shape", "warmup"]
