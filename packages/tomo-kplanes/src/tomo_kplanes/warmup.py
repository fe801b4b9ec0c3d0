"""Warm-up: compile every kernel a reconstruction training step needs, before the first step.

A shape is ``"RxCxT"``: plane resolution ``R`` (the volume side), ``C`` feature channels per plane
and ``T`` learned rotations (a :class:`~tomo_kplanes.KPlanesTilted` field), with optional flags
after a colon, comma separated:

* ``plain`` — plain K-Planes (:class:`~tomo_kplanes.KPlanes`: one fixed identity rotation, what
  ``ReconstructionConfig(rotations=0)`` builds); ``T`` must be 1.

A tuple ``(R, C, T)`` of ints is the same shape without flags. The batch of a step is a keyword of
:func:`warmup`: ``rays`` rays of ``samples`` samples each and ``tv_points`` volume-TV points (four
taps each; 0 leaves the volume TV out), by default the 200³ benchmark's 1024, 200 and 10,000.

A shape runs one training step as :func:`~tomo_kplanes.reconstruct` runs it: the field's one call
on the ray samples and the folded volume-TV taps with the plane TV taken in the same op, the fused
ray loss (constraints, line integrals, MSE, volume TV), the backward, gradient clipping and the
Adam step, on the field, object and optimizer ``reconstruct`` builds.

``TUNING_SHAPES`` are the regimes ``python -m triton_dispatch.tune tomo_kplanes`` measures. The
plane-feature kernels choose their config by the channel block (``C`` rounded up to a power of
two), the rotation count (forward: rounded up to a power of two, at most 8; backward: exact) and
whether the rotations are learned; not by the resolution or the batch, so one resolution stands
for all (the loss and plane-TV kernels launch fixed blocks: nothing to tune, but they compile).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from torch import nn

from triton_dispatch.warmup import WarmupReport, run_warmup

from .geometry import TiltGeometry, tilt_range
from .objective import LossWeights, ReconstructionContext, reconstruction_loss
from .train import ReconstructionConfig, build_object, make_optimizer

FLAGS = ("plain",)

#: The regimes the tuning command measures: C in {16, 32, 64} by T in {1, 2, 4, 8} (the channel
#: blocks and rotation counts the kernels key on), the command line's default field (C = 8,
#: T = 2), and plain K-Planes. The 200³, C = 32, T = 4 step of ``benchmarks/training_step.py``
#: stands for its regime; the others run at resolution 128 (the configs do not key on it).
TUNING_SHAPES: list[str] = [
    "200x32x4",
    *(f"128x{c}x{t}" for c in (16, 32, 64) for t in (1, 2, 4, 8) if (c, t) != (32, 4)),
    "128x8x2",
    "128x16x1:plain",
    "128x32x1:plain",
    "128x64x1:plain",
]

_SHAPE = re.compile(r"^(\d+)x(\d+)x(\d+)(?::([a-z0-9,]+))?$")
_NOTATION = "'RxCxT[:plain]' (resolution x channels x rotations, e.g. '200x32x4')"


def parse_shape(spec: str | Sequence[int]) -> tuple[tuple[int, int, int], frozenset[str]]:
    """``((resolution, channels, rotations), flags)`` of one warm-up shape (module docstring)."""
    if isinstance(spec, str):
        match = _SHAPE.match(spec.strip().lower())
        if match is None:
            raise ValueError(f"shapes: {spec!r} is not {_NOTATION}")
        sizes = tuple(int(g) for g in match.groups()[:3])
        flags = frozenset(f for f in (match.group(4) or "").split(",") if f)
    else:
        try:
            values = tuple(spec)
        except TypeError:
            values = ()
        if len(values) != 3 or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in values
        ):
            raise ValueError(f"shapes: {spec!r} is not (resolution, channels, rotations) of ints")
        sizes, flags = values, frozenset()
    if min(sizes) <= 0:
        raise ValueError(f"shapes: every size must be positive, got {spec!r}; expected {_NOTATION}")
    if sizes[0] < 2:
        raise ValueError(f"shapes: the resolution must be at least 2, got {spec!r}")
    unknown = flags - set(FLAGS)
    if unknown:
        raise ValueError(f"shapes: unknown flags {sorted(unknown)} in {spec!r}; known: {FLAGS}")
    if "plain" in flags and sizes[2] != 1:
        raise ValueError(f"shapes: plain K-Planes has one rotation (T = 1), got {spec!r}")
    return sizes, flags  # type: ignore[return-value]


def _call(sizes, flags, *, device, dtype, backward, rays, samples, tv_points, backend):
    resolution, channels, rotations = sizes
    config = ReconstructionConfig(
        resolution=resolution,
        channels=channels,
        rotations=0 if "plain" in flags else rotations,
        rays_per_batch=rays,
        samples_per_ray=samples,
        tv_points=tv_points,
        backend=backend,
        progress=False,
    )
    # the decoder's default initialisation draws from the global CPU generator before the field's
    # own generator overwrites it: leave the caller's stream as it was
    with torch.random.fork_rng(devices=[]):
        obj = build_object(config, device).to(dtype)
    optimizer = make_optimizer(obj.field, config)
    g = torch.Generator().manual_seed(0)
    geometry = TiltGeometry(tilt_range(60, 30), (resolution, resolution)).to(device)
    idx = torch.randint(0, geometry.num_rays, (rays,), generator=g).to(device)
    points, steps = geometry.rays(idx, samples, dtype=dtype)
    target = torch.rand(rays, generator=g).to(device=device, dtype=dtype)
    weights = LossWeights(volume_tv=1e-3 if tv_points else 0.0, plane_tv=1e-4)
    gen = torch.Generator(device=device).manual_seed(0)

    def step():
        ctx = ReconstructionContext()
        if tv_points:
            ctx.tv_tap_points = obj.sample_tv_tap_coords(
                tv_points, generator=gen, device=device, dtype=dtype
            )
        with torch.set_grad_enabled(backward):
            loss, _ = reconstruction_loss(
                obj, points, steps, target, weights, ctx, fold_taps=config.fold_taps
            )
        if backward:
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip > 0:
                nn.utils.clip_grad_norm_(obj.parameters(), config.grad_clip)
            optimizer.step()

    return step


def warmup(
    shapes: Sequence[str | Sequence[int]] | str | None = None,
    *,
    device: torch.device | str = "cuda",
    dtype: torch.dtype = torch.float32,
    backward: bool = True,
    workers: int = 1,
    rays: int = 1024,
    samples: int = 200,
    tv_points: int = 10_000,
    backend: str | None = None,
) -> WarmupReport:
    """Run one reconstruction training step at each shape so that its kernels are compiled
    before the first real step.

    Args:
        shapes: ``"RxCxT[:plain]"`` strings or ``(R, C, T)`` tuples (module docstring); ``None``
            warms :data:`TUNING_SHAPES`.
        device: where the reconstruction will run (``"cpu"`` runs the PyTorch path, or the
            interpreter under ``TRITON_INTERPRET=1``).
        dtype: float32 (what :func:`~tomo_kplanes.reconstruct` trains in) or float64.
        backward: also run the backward, clipping and Adam step; ``False`` runs the loss under
            ``torch.no_grad()``.
        workers: shapes warmed at once on threads (kernels of different shapes compile side by
            side).
        rays, samples, tv_points: the step's batch: rays, samples per ray, volume-TV points
            (0: no volume TV), as ``ReconstructionConfig``'s ``rays_per_batch``,
            ``samples_per_ray`` and ``tv_points``.
        backend: the field's kernel backend (``None``: automatic), as ``ReconstructionConfig``'s.

    Returns:
        a :class:`~triton_dispatch.warmup.WarmupReport` (seconds, calls, kernels compiled).

    Each shape builds its own small field, rays and optimizer on ``device``; the caller's random
    streams are left as they were.
    """
    if isinstance(shapes, str):
        shapes = [shapes]
    for name, value, least in (
        ("rays", rays, 1),
        ("samples", samples, 1),
        ("tv_points", tv_points, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    parsed = [parse_shape(s) for s in (TUNING_SHAPES if shapes is None else shapes)]
    options = dict(
        device=device, dtype=dtype, backward=backward, rays=rays, samples=samples,
        tv_points=tv_points, backend=backend,
    )  # fmt: skip
    calls = [_call(sizes, flags, **options) for sizes, flags in parsed]
    return run_warmup(calls, workers=workers, device=device)


__all__ = ["FLAGS", "TUNING_SHAPES", "parse_shape", "warmup"]
