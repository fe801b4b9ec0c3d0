"""Triton kernels of ``ray_loss``.

Forward, two launches: one pass in which each program reduces either a block of rays (constrained
densities summed along each ray, the residual of its line integral stored for the backward, the
block's sum of squared residuals) or a block of TV taps (the block's sum of gradient norms), then
one program that adds the partial sums in a fixed order and assembles the total and the terms.
Backward, one launch: the gradient of every density, main samples and taps, in one pass, and the
gradient of the plane-TV input.

Float arguments travel as two float32 halves (``hi + lo``): Triton passes a Python float as
float32, which would round a float64 call's weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import triton
import triton.language as tl

from triton_dispatch import interpreter_enabled, next_power_of_2
from triton_dispatch.compile_ahead import backward_follows
from triton_dispatch.launch import KernelLaunch, PlanCache

from .reference import VOLUME_TV_EPS

if TYPE_CHECKING:
    from triton_dispatch.declaration import Call

_EPS = tl.constexpr(VOLUME_TV_EPS)


@triton.jit
def _scalar(hi, lo, dtype: tl.constexpr):
    # tl.cast, not .to(): the interpreter passes float arguments as Python floats
    if dtype == tl.float64:
        return tl.cast(hi, tl.float64) + tl.cast(lo, tl.float64)
    else:
        return tl.cast(hi, dtype)


@triton.jit
def _sqrt(x):
    # correctly rounded, as torch.sqrt (tl.sqrt is the fast approximation for float32)
    if x.dtype == tl.float32:
        return tl.sqrt_rn(x)
    else:
        return tl.sqrt(x)


@triton.jit
def _constrained(
    d, point_ptrs, stride_pd, mask, shrinkage,
    POSITIVITY: tl.constexpr, SHRINK: tl.constexpr, MASK: tl.constexpr,
):  # fmt: skip
    """The hard constraints of :func:`apply_constraints` and where the gradient passes them."""
    passes = mask
    if SHRINK:
        excess = tl.abs(d) - shrinkage
        sign = tl.where(d > 0, 1.0, tl.where(d < 0, -1.0, 0.0))
        passes = passes & (excess >= 0) & (d != 0)
        # where(excess < 0, 0, excess), not maximum(): GPU max drops a NaN that clamp_min keeps
        d = sign * tl.where(excess < 0, 0.0, excess)
    if POSITIVITY:
        passes = passes & (d >= 0)
        d = tl.where(d < 0, 0.0, d)
    if MASK:
        px = tl.load(point_ptrs, mask=mask, other=0.0)
        py = tl.load(point_ptrs + stride_pd, mask=mask, other=0.0)
        pz = tl.load(point_ptrs + 2 * stride_pd, mask=mask, other=0.0)
        inside = (tl.abs(px) <= 1.0) & (tl.abs(py) <= 1.0) & (tl.abs(pz) <= 1.0)
        passes = passes & inside
        d = tl.where(inside, d, 0.0)
    return d, passes


@triton.jit
def _tap_differences(dens_ptr, offs, mask, M, h):
    """The base tap and the forward differences ``(t_k − t_0) / h`` of the taps ``offs``."""
    t0 = tl.load(dens_ptr + offs, mask=mask, other=0.0)
    dx = (tl.load(dens_ptr + M + offs, mask=mask, other=0.0) - t0) / h
    dy = (tl.load(dens_ptr + 2 * M + offs, mask=mask, other=0.0) - t0) / h
    dz = (tl.load(dens_ptr + 3 * M + offs, mask=mask, other=0.0) - t0) / h
    return dx, dy, dz


@triton.jit(do_not_specialize=["B", "S", "M", "RAY_PROGRAMS"])
def _forward_kernel(
    dens_ptr, points_ptr, steps_ptr, target_ptr, resid_ptr, partial_ptr,
    B, S, M, stride_pb, stride_ps, stride_pd,
    shrink_hi, shrink_lo, h_hi, h_lo,
    RAY_PROGRAMS,
    POSITIVITY: tl.constexpr, SHRINK: tl.constexpr, MASK: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr, S_TILES: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    dtype = dens_ptr.dtype.element_ty
    if pid < RAY_PROGRAMS:
        shrinkage = _scalar(shrink_hi, shrink_lo, dtype)
        rays = pid * BLOCK_B + tl.arange(0, BLOCK_B)
        ray_in = rays < B
        acc = tl.zeros([BLOCK_B, BLOCK_S], dtype=dtype)
        for tile in range(S_TILES):  # a constexpr trip count: see the note in _finish_kernel
            s = tile * BLOCK_S + tl.arange(0, BLOCK_S)
            m = ray_in[:, None] & (s < S)[None, :]
            d = tl.load(dens_ptr + rays[:, None] * S + s[None, :], mask=m, other=0.0)
            point_ptrs = points_ptr + rays[:, None] * stride_pb + s[None, :] * stride_ps
            d, _ = _constrained(d, point_ptrs, stride_pd, m, shrinkage, POSITIVITY, SHRINK, MASK)
            acc += tl.where(m, d, 0.0)
        step = tl.load(steps_ptr + rays, mask=ray_in, other=0.0)
        target = tl.load(target_ptr + rays, mask=ray_in, other=0.0)
        resid = tl.sum(acc, axis=1) * step - target
        tl.store(resid_ptr + rays, resid, mask=ray_in)
        tl.store(partial_ptr + pid, tl.sum(tl.where(ray_in, resid * resid, 0.0), axis=0))
    else:
        h = _scalar(h_hi, h_lo, dtype)
        # names differ from the other branch's: compiled Triton merges same-named values of
        # both branches of a runtime test, and their shapes differ
        offs = (pid - RAY_PROGRAMS) * BLOCK_M + tl.arange(0, BLOCK_M)
        tap_ok = offs < M
        dx, dy, dz = _tap_differences(dens_ptr + B * S, offs, tap_ok, M, h)
        norm = _sqrt(dx * dx + dy * dy + dz * dz + tl.full([BLOCK_M], _EPS, dtype))
        tl.store(partial_ptr + pid, tl.sum(tl.where(tap_ok, norm, 0.0), axis=0))


@triton.jit(do_not_specialize=["B", "M", "RAY_PROGRAMS", "TAP_PROGRAMS"])
def _finish_kernel(
    partial_ptr, plane_tv_ptr, total_ptr, terms_ptr,
    B, M, RAY_PROGRAMS, TAP_PROGRAMS, wv_hi, wv_lo, wp_hi, wp_lo,
    HAS_TAPS: tl.constexpr, HAS_PLANE_TV: tl.constexpr, BLOCK: tl.constexpr,
    RAY_TILES: tl.constexpr, TAP_TILES: tl.constexpr,
):  # fmt: skip
    # loops run a constexpr number of times: Triton 3.6's interpreter reads a runtime loop bound
    # with int() of a one-element array, which numpy 2.4 refuses
    dtype = total_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK], dtype=dtype)
    for tile in range(RAY_TILES):
        i = tile * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(partial_ptr + i, mask=i < RAY_PROGRAMS, other=0.0)
    data = tl.sum(acc, axis=0) / B.to(dtype)
    total = data
    volume = tl.zeros([], dtype=dtype)
    plane = tl.zeros([], dtype=dtype)
    if HAS_TAPS:
        acc = tl.zeros([BLOCK], dtype=dtype)
        for tile in range(TAP_TILES):
            i = tile * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(partial_ptr + RAY_PROGRAMS + i, mask=i < TAP_PROGRAMS, other=0.0)
        volume = _scalar(wv_hi, wv_lo, dtype) * (tl.sum(acc, axis=0) / M.to(dtype))
        total = total + volume
    if HAS_PLANE_TV:
        plane = _scalar(wp_hi, wp_lo, dtype) * tl.load(plane_tv_ptr).to(dtype)
        total = total + plane
    tl.store(total_ptr, total)
    tl.store(terms_ptr, data)
    tl.store(terms_ptr + 1, volume)
    tl.store(terms_ptr + 2, plane)


@triton.jit(do_not_specialize=["B", "S", "M", "MAIN_PROGRAMS"])
def _backward_kernel(
    grad_total_ptr, grad_terms_ptr, dens_ptr, points_ptr, steps_ptr, resid_ptr,
    grad_dens_ptr, grad_plane_tv_ptr,
    B, S, M, stride_pb, stride_ps, stride_pd,
    shrink_hi, shrink_lo, h_hi, h_lo, wv_hi, wv_lo, wp_hi, wp_lo,
    MAIN_PROGRAMS,
    POSITIVITY: tl.constexpr, SHRINK: tl.constexpr, MASK: tl.constexpr,
    TERMS_GRAD: tl.constexpr, HAS_PLANE_TV: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    dtype = grad_dens_ptr.dtype.element_ty
    g = tl.load(grad_total_ptr).to(dtype)
    g_data = g
    g_volume = g
    g_plane = g
    if TERMS_GRAD:  # the terms were differentiated too: their gradients add to the total's
        g_data = g + tl.load(grad_terms_ptr).to(dtype)
        g_volume = g + tl.load(grad_terms_ptr + 1).to(dtype)
        g_plane = g + tl.load(grad_terms_ptr + 2).to(dtype)
    if HAS_PLANE_TV:  # noqa: SIM102 (a constexpr test outside, a runtime one inside)
        if pid == 0:
            tl.store(grad_plane_tv_ptr, g_plane * _scalar(wp_hi, wp_lo, dtype))
    if pid < MAIN_PROGRAMS:
        shrinkage = _scalar(shrink_hi, shrink_lo, dtype)
        n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        m = n < B * S
        ray = n // S
        sample = n - ray * S
        resid = tl.load(resid_ptr + ray, mask=m, other=0.0)
        step = tl.load(steps_ptr + ray, mask=m, other=0.0)
        # the chain of mean → square → line integral, in autograd's order
        grad = (g_data / B.to(dtype)) * (2.0 * resid) * step
        d = tl.load(dens_ptr + n, mask=m, other=0.0)
        point_ptrs = points_ptr + ray * stride_pb + sample * stride_ps
        _, passes = _constrained(d, point_ptrs, stride_pd, m, shrinkage, POSITIVITY, SHRINK, MASK)
        tl.store(grad_dens_ptr + n, tl.where(passes, grad, 0.0), mask=m)
    else:
        h = _scalar(h_hi, h_lo, dtype)
        offs = (pid - MAIN_PROGRAMS) * BLOCK_M + tl.arange(0, BLOCK_M)
        tap_ok = offs < M  # not `m`: see the forward kernel
        taps = dens_ptr + B * S
        dx, dy, dz = _tap_differences(taps, offs, tap_ok, M, h)
        norm = _sqrt(dx * dx + dy * dy + dz * dz + tl.full([BLOCK_M], _EPS, dtype))
        # weight → mean → sqrt → squares → / h → differences
        q = (g_volume * _scalar(wv_hi, wv_lo, dtype)) / M.to(dtype) / (2.0 * norm)
        gx = q * (2.0 * dx) / h
        gy = q * (2.0 * dy) / h
        gz = q * (2.0 * dz) / h
        out = grad_dens_ptr + B * S
        tl.store(out + offs, -(gx + gy + gz), mask=tap_ok)
        tl.store(out + M + offs, gx, mask=tap_ok)
        tl.store(out + 2 * M + offs, gy, mask=tap_ok)
        tl.store(out + 3 * M + offs, gz, mask=tap_ok)


def _halves(x: float) -> tuple[float, float]:
    """``x`` as two float32 values whose sum in float64 is ``x`` to about 48 bits."""
    hi = float(torch.tensor(x, dtype=torch.float32))
    return hi, float(torch.tensor(x - hi, dtype=torch.float32))


class RayLossPlan:
    """Launches of one kind of call: sizes, flags, weights, grids and block sizes fixed once."""

    def __init__(
        self, rays, samples, taps, points_stride, dtype, device, has_plane_tv,
        tv_step, volume_tv_weight, plane_tv_weight, positivity, shrinkage, mask_out_of_bounds,
    ) -> None:  # fmt: skip
        interpreting = interpreter_enabled()
        self.dtype, self.device, self.rays, self.has_plane_tv = dtype, device, rays, has_plane_tv
        self.numel = rays * samples + 4 * taps
        block_s = min(next_power_of_2(samples), 256)
        block_b = max(1, min(next_power_of_2(rays), 4096 // block_s))
        block_m = 256 if interpreting else 512
        block_n = 256 if interpreting else 1024
        ray_programs = triton.cdiv(rays, block_b)
        tap_programs = triton.cdiv(taps, block_m)
        self.partials = ray_programs + tap_programs
        main_programs = triton.cdiv(rays * samples, block_n)
        flags = dict(POSITIVITY=positivity, SHRINK=shrinkage > 0, MASK=mask_out_of_bounds)
        sizes = dict(
            B=rays, S=samples, M=taps, stride_pb=points_stride[0], stride_ps=points_stride[1],
            stride_pd=points_stride[2],
        )  # fmt: skip
        (shrink_hi, shrink_lo), (h_hi, h_lo) = _halves(shrinkage), _halves(tv_step)
        (wv_hi, wv_lo), (wp_hi, wp_lo) = _halves(volume_tv_weight), _halves(plane_tv_weight)
        scalars = dict(shrink_hi=shrink_hi, shrink_lo=shrink_lo, h_hi=h_hi, h_lo=h_lo)
        weights = dict(wv_hi=wv_hi, wv_lo=wv_lo, wp_hi=wp_hi, wp_lo=wp_lo)
        warps = {"num_warps": 1 if interpreting else 4}
        self.forward_launch = KernelLaunch(
            _forward_kernel,
            (self.partials,),
            dict(
                **sizes,
                **scalars,
                RAY_PROGRAMS=ray_programs,
                BLOCK_B=block_b,
                BLOCK_S=block_s,
                BLOCK_M=block_m,
                S_TILES=triton.cdiv(samples, block_s),
                **flags,
            ),
            device=device,
            options=warps,
        )
        self.finish_launch = KernelLaunch(
            _finish_kernel,
            (1,),
            dict(
                B=rays,
                M=taps,
                RAY_PROGRAMS=ray_programs,
                TAP_PROGRAMS=tap_programs,
                **weights,
                HAS_TAPS=taps > 0,
                HAS_PLANE_TV=has_plane_tv,
                BLOCK=256,
                RAY_TILES=triton.cdiv(ray_programs, 256),
                TAP_TILES=triton.cdiv(tap_programs, 256),
            ),
            device=device,
            options=warps,
        )
        self.backward_launches = {
            terms_grad: KernelLaunch(
                _backward_kernel,
                (main_programs + tap_programs,),
                dict(
                    **sizes,
                    **scalars,
                    **weights,
                    MAIN_PROGRAMS=main_programs,
                    TERMS_GRAD=terms_grad,
                    HAS_PLANE_TV=has_plane_tv,
                    BLOCK_N=block_n,
                    BLOCK_M=block_m,
                    **flags,
                ),
                device=device,
                options=warps,
            )
            for terms_grad in (False, True)
        }

    def compile_ahead(self, backward: bool) -> None:
        """Compile the finishing pass, and the backward when one follows (of a loss whose terms
        are only logged), on background threads while the forward compiles."""
        self.finish_launch.compile_ahead(*(self.dtype,) * 4)
        if backward:
            self.backward_launches[False].compile_ahead(*(self.dtype,) * 8)

    def forward(self, densities, points, steps, target, plane_tv):
        """``(total, terms, residuals)``."""
        new = torch.empty
        partial = new(self.partials, dtype=self.dtype, device=self.device)
        resid = new(self.rays, dtype=self.dtype, device=self.device)
        total = new((), dtype=self.dtype, device=self.device)
        terms = new(3, dtype=self.dtype, device=self.device)
        self.forward_launch(densities, points, steps, target, resid, partial)
        self.finish_launch(partial, total if plane_tv is None else plane_tv, total, terms)
        return total, terms, resid

    def backward(self, grad_total, grad_terms, densities, points, steps, plane_tv, resid):
        """``(grad_densities, grad_plane_tv or None)``; a ``None`` gradient of the total or the
        terms is one nobody asked for."""
        if grad_total is None:
            grad_total = torch.zeros((), dtype=self.dtype, device=self.device)
        has_plane_tv = self.has_plane_tv
        grad = torch.empty(self.numel, dtype=self.dtype, device=self.device)
        grad_plane = torch.empty((), dtype=self.dtype, device=self.device) if has_plane_tv else grad
        launch = self.backward_launches[grad_terms is not None]
        launch(
            grad_total, grad_total if grad_terms is None else grad_terms, densities, points,
            steps, resid, grad, grad_plane,
        )  # fmt: skip
        return grad, (grad_plane if has_plane_tv else None)


_PLANS: PlanCache[RayLossPlan] = PlanCache("tomo_kplanes.ray_loss_kernels")


#: the settings of ``ray_loss``, by the names :class:`RayLossPlan` takes them
SETTINGS = (
    "tv_step", "volume_tv_weight", "plane_tv_weight", "positivity", "shrinkage",
    "mask_out_of_bounds",
)  # fmt: skip


class _ContiguousCopyPlan:
    """Densities, steps or targets that are strided views: the kernels read dense copies (the
    backward gets its saved tensors contiguous already)."""

    def __init__(self, plan: RayLossPlan) -> None:
        self.plan = plan
        self.backward = plan.backward

    def forward(self, densities, points, steps, target, plane_tv):
        return self.plan.forward(
            densities.contiguous(), points, steps.contiguous(), target.contiguous(), plane_tv
        )


def _plan(named: Mapping[str, Any], settings: Mapping[str, Any]) -> RayLossPlan | None:
    densities, points, plane_tv = named["densities"], named["points"], named["plane_tv"]
    rays, samples = points.shape[0], points.shape[1]
    if not rays or not samples:  # no ray for the kernels to integrate: the reference
        return None
    meta = (
        rays, samples, (densities.shape[0] - rays * samples) // 4, points.stride(),
        densities.dtype, densities.device, plane_tv is not None,
    )  # fmt: skip
    values = {name: settings[name] for name in SETTINGS}

    def build() -> RayLossPlan:
        plan = RayLossPlan(*meta, **values)
        plan.compile_ahead(backward_follows(densities, plane_tv))
        return plan

    return _PLANS.get((*meta, *values.values()), build)


def ray_loss_plan(call: Call) -> RayLossPlan | _ContiguousCopyPlan | None:
    """The plan of a validated call (``None``: the reference runs it)."""
    plan = _plan(call.tensors, call.settings)
    if plan is None or all(call[n].is_contiguous() for n in ("densities", "steps", "target")):
        return plan
    return _ContiguousCopyPlan(plan)


def ray_loss_backward_plan(named: Mapping[str, Any]) -> RayLossPlan | None:
    """The plan of the backward op, from the saved tensors and the settings by name."""
    return _plan(named, named)
