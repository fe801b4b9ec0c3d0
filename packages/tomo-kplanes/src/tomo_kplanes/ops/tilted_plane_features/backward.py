"""Triton backward of ``tilted_plane_features``.

One program per block of points loops over the rotations, recomputes the three samples, scatters
the plane gradients with atomics, and (when asked) reduces the coordinate gradients to the
rotation gradients (atomics, 9 scalars per program and rotation) and the point gradients (plain
stores: one program owns its points across all rotations).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_dispatch import autotune, config_space
from triton_dispatch.compile_ahead import backward_follows
from triton_dispatch.launch import KernelLaunch, PlanCache

from .forward import bound_arguments, forward_plan
from .sampling import (
    rotated_coordinates,
    sample_plane_with_slopes,
    scatter_plane_grad,
    scatter_plane_grad_runs,
    texel_key,
)


# fmt: off
def _one_config_for_runs(configs: list, named_args: dict, **kwargs) -> list:
    # the run-reduced kernel compiles about five times slower: tune it over one config, not nine
    if kwargs.get("RUNS"):
        return [c for c in configs if c.kwargs["BLOCK_N"] == 64 and c.num_warps == 4] or configs[:1]
    return configs


@autotune(
    config_space({"BLOCK_N": [32, 64, 128]}, num_warps=[2, 4, 8], num_stages=[1]),
    key=["BLOCK_C", "T", "COORD_GRAD", "RUNS"],
    prune=_one_config_for_runs,
    # grad_planes may start from another gradient (the plane TV's, see tilted_plane_features_with_tv):
    # each trial starts from a copy of it rather than from zeros
    reset_to_zero=["grad_rot_ptr"],
    restore_value=["grad_planes_ptr"],
    interpret_config=triton.Config({"BLOCK_N": 16}, num_warps=1, num_stages=1),
)
@triton.jit(do_not_specialize=["H", "W"])
def _backward_kernel(
    grad_out_ptr, points_ptr, rot_ptr, planes_ptr,
    grad_points_ptr, grad_rot_ptr, grad_planes_ptr,
    N, C, H, W,
    stride_gn, stride_gc,
    stride_pn, stride_pd,
    stride_rt, stride_ri, stride_rj,
    stride_lp, stride_lc, stride_lh, stride_lw,
    stride_glp, stride_glc, stride_glh, stride_glw,
    T_BUCKET,
    T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, COORD_GRAD: tl.constexpr,
    RUNS: tl.constexpr,
):
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, BLOCK_C)
    n_mask = offs_n < N
    mask = n_mask[:, None] & (offs_c < C)[None, :]

    px = tl.load(points_ptr + offs_n * stride_pn, mask=n_mask, other=0.0)
    py = tl.load(points_ptr + offs_n * stride_pn + stride_pd, mask=n_mask, other=0.0)
    pz = tl.load(points_ptr + offs_n * stride_pn + 2 * stride_pd, mask=n_mask, other=0.0)
    if RUNS:
        # the neighbours along the point order, to find runs of points that read the same cell
        prev_n = offs_n - 1
        next_n = offs_n + 1
        prev_in = (prev_n >= 0) & (prev_n < N)
        next_in = next_n < N
        ax = tl.load(points_ptr + prev_n * stride_pn, mask=prev_in, other=0.0)
        ay = tl.load(points_ptr + prev_n * stride_pn + stride_pd, mask=prev_in, other=0.0)
        az = tl.load(points_ptr + prev_n * stride_pn + 2 * stride_pd, mask=prev_in, other=0.0)
        bx = tl.load(points_ptr + next_n * stride_pn, mask=next_in, other=0.0)
        by = tl.load(points_ptr + next_n * stride_pn + stride_pd, mask=next_in, other=0.0)
        bz = tl.load(points_ptr + next_n * stride_pn + 2 * stride_pd, mask=next_in, other=0.0)
        first = tl.arange(0, BLOCK_N) == 0
        final = tl.arange(0, BLOCK_N) == BLOCK_N - 1
    gpx = tl.zeros_like(px)
    gpy = tl.zeros_like(px)
    gpz = tl.zeros_like(px)
    c_off = (offs_c * stride_lc)[None, :]
    gc_off = (offs_c * stride_glc)[None, :]

    for t in range(0, T):
        qx, qy, qz, valid, r00, r01, r02, r10, r11, r12, r20, r21, r22 = rotated_coordinates(
            rot_ptr + t * stride_rt, stride_ri, stride_rj, px, py, pz
        )
        # a (point, rotation) pair with a non-finite coordinate contributes nothing
        vmask = mask & valid[:, None]

        g_ptrs = (
            grad_out_ptr
            + offs_n.to(tl.int64)[:, None] * stride_gn
            + (t * C + offs_c)[None, :] * stride_gc
        )
        g = tl.load(g_ptrs, mask=vmask, other=0.0).to(px.dtype)

        base = planes_ptr + 3 * t * stride_lp
        s0, du0, dv0, a00, a01, a10, a11, fu0, fv0 = sample_plane_with_slopes(
            base, c_off, mask, qx, qy, W, H, stride_lh, stride_lw
        )
        s1, du1, dv1, b00, b01, b10, b11, fu1, fv1 = sample_plane_with_slopes(
            base + stride_lp, c_off, mask, qz, qx, W, H, stride_lh, stride_lw
        )
        s2, du2, dv2, e00, e01, e10, e11, fu2, fv2 = sample_plane_with_slopes(
            base + 2 * stride_lp, c_off, mask, qy, qz, W, H, stride_lh, stride_lw
        )
        g0 = g * s1 * s2
        g1 = g * s0 * s2
        g2 = g * s0 * s1

        gbase = grad_planes_ptr + 3 * t * stride_glp
        # grad_planes shares the planes' strides (see BackwardPlan), so texel offsets carry over
        if RUNS:
            r_t = rot_ptr + t * stride_rt
            ux, uy, uz, uvalid, _, _, _, _, _, _, _, _, _ = rotated_coordinates(
                r_t, stride_ri, stride_rj, ax, ay, az
            )
            wx, wy, wz, wvalid, _, _, _, _, _, _, _, _, _ = rotated_coordinates(
                r_t, stride_ri, stride_rj, bx, by, bz
            )
            here = valid & n_mask
            uvalid = uvalid & prev_in
            wvalid = wvalid & next_in
            for k in tl.static_range(3):
                # plane k reads (coordinate k → W, coordinate (k + 1) % 3 → H)
                if k == 0:
                    key = texel_key(qx, qy, W, H, here, offs_n)
                    key_p = texel_key(ux, uy, W, H, uvalid, prev_n)
                    key_n = texel_key(wx, wy, W, H, wvalid, next_n)
                elif k == 1:
                    key = texel_key(qz, qx, W, H, here, offs_n)
                    key_p = texel_key(uz, ux, W, H, uvalid, prev_n)
                    key_n = texel_key(wz, wx, W, H, wvalid, next_n)
                else:
                    key = texel_key(qy, qz, W, H, here, offs_n)
                    key_p = texel_key(uy, uz, W, H, uvalid, prev_n)
                    key_n = texel_key(wy, wz, W, H, wvalid, next_n)
                start = (key != key_p) | first
                end = (key != key_n) | final
                if k == 0:
                    scatter_plane_grad_runs(gbase, gc_off, vmask, g0, a00, a01, a10, a11, fu0, fv0, start, end)
                elif k == 1:
                    scatter_plane_grad_runs(
                        gbase + stride_glp, gc_off, vmask, g1, b00, b01, b10, b11, fu1, fv1, start, end
                    )
                else:
                    scatter_plane_grad_runs(
                        gbase + 2 * stride_glp, gc_off, vmask, g2, e00, e01, e10, e11, fu2, fv2, start, end
                    )
        else:
            scatter_plane_grad(gbase, gc_off, vmask, g0, a00, a01, a10, a11, fu0, fv0)
            scatter_plane_grad(gbase + stride_glp, gc_off, vmask, g1, b00, b01, b10, b11, fu1, fv1)
            scatter_plane_grad(gbase + 2 * stride_glp, gc_off, vmask, g2, e00, e01, e10, e11, fu2, fv2)

        if COORD_GRAD:
            # plane 0 reads (qx → W, qy → H), plane 1 (qz, qx), plane 2 (qy, qz)
            gqx = tl.sum(g0 * du0, axis=1) + tl.sum(g1 * dv1, axis=1)
            gqy = tl.sum(g0 * dv0, axis=1) + tl.sum(g2 * du2, axis=1)
            gqz = tl.sum(g1 * du1, axis=1) + tl.sum(g2 * dv2, axis=1)
            gr = grad_rot_ptr + t * 9
            # sanitised copies: 0 · NaN would poison the sums (gq is already 0 where invalid)
            spx = tl.where(valid, px, 0.0)
            spy = tl.where(valid, py, 0.0)
            spz = tl.where(valid, pz, 0.0)
            tl.atomic_add(gr + 0, tl.sum(gqx * spx, axis=0), sem="relaxed")
            tl.atomic_add(gr + 1, tl.sum(gqx * spy, axis=0), sem="relaxed")
            tl.atomic_add(gr + 2, tl.sum(gqx * spz, axis=0), sem="relaxed")
            tl.atomic_add(gr + 3, tl.sum(gqy * spx, axis=0), sem="relaxed")
            tl.atomic_add(gr + 4, tl.sum(gqy * spy, axis=0), sem="relaxed")
            tl.atomic_add(gr + 5, tl.sum(gqy * spz, axis=0), sem="relaxed")
            tl.atomic_add(gr + 6, tl.sum(gqz * spx, axis=0), sem="relaxed")
            tl.atomic_add(gr + 7, tl.sum(gqz * spy, axis=0), sem="relaxed")
            tl.atomic_add(gr + 8, tl.sum(gqz * spz, axis=0), sem="relaxed")
            gpx += tl.where(valid, r00 * gqx + r10 * gqy + r20 * gqz, 0.0)
            gpy += tl.where(valid, r01 * gqx + r11 * gqy + r21 * gqz, 0.0)
            gpz += tl.where(valid, r02 * gqx + r12 * gqy + r22 * gqz, 0.0)

    if COORD_GRAD:
        gp = grad_points_ptr + offs_n * 3
        tl.store(gp, gpx, mask=n_mask)
        tl.store(gp + 1, gpy, mask=n_mask)
        tl.store(gp + 2, gpz, mask=n_mask)
# fmt: on


#: Pre-reduce the plane-gradient atomics over runs of consecutive points that read the same cell
#: (ray-ordered samples). Off by default: it is tested for correctness but not yet measured on a GPU,
#: and its segmented scans make the kernel much slower to compile (a first GPU attempt spent most of
#: a minute compiling the nine autotune configs). Module-level so benchmarks can compare both.
PRE_REDUCE_RUNS = False


class BackwardPlan:
    """The backward launch of one kind of call (sizes, strides, dtype, device, which gradients,
    the run pre-reduction switch), bound once."""

    def __init__(
        self, n, t, plane_shape, points_stride, rot_stride, planes_stride, dtype, device,
        coordinate_grad, runs,
    ) -> None:  # fmt: skip
        c = plane_shape[1]
        self.n, self.t, self.dtype, self.device = n, t, dtype, device
        self.coordinate_grad, self.runs = coordinate_grad, runs
        # grad_planes shares the planes' strides (the kernel reuses the texel offsets it computes
        # for the planes); planes in a layout zeros_like cannot reproduce (not dense) are copied
        probe = torch.empty_strided(plane_shape, planes_stride, dtype=dtype, device="meta")
        self.copy_planes = torch.empty_like(probe).stride() != tuple(planes_stride)
        if self.copy_planes:
            planes_stride = torch.empty(plane_shape, device="meta").stride()
        # without coordinate_grad: the pointer arguments the kernel never touches (not
        # grad_planes itself, which autotuning would zero as grad_rot_ptr while it may hold the
        # plane TV's gradient); made once, not per call
        self.unused = None if coordinate_grad else torch.empty(1, dtype=dtype, device=device)
        self.launch = KernelLaunch(
            _backward_kernel,
            lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),),
            dict(
                bound_arguments(n, t, plane_shape, points_stride, rot_stride, planes_stride),
                stride_gn=t * c,
                stride_gc=1,
                **dict(
                    zip(("stride_glp", "stride_glc", "stride_glh", "stride_glw"), planes_stride)
                ),
                T=t,
                COORD_GRAD=coordinate_grad,
                RUNS=runs,
            ),
            device=device,
        )

    def __call__(self, grad_out, points, rotations, planes, grad_planes=None):
        """``(grad_points, grad_rotations, grad_planes)`` of a contiguous ``grad_out``; the first
        two are ``None`` without ``coordinate_grad``. ``grad_planes``: a buffer with the planes'
        strides that the plane gradient is added into (and returned), zeros when ``None``."""
        if self.copy_planes:
            planes = planes.contiguous()
        if grad_planes is None:
            grad_planes = torch.zeros_like(planes, memory_format=torch.preserve_format)
        if self.coordinate_grad:
            grad_rot = torch.zeros((self.t, 3, 3), dtype=self.dtype, device=self.device)
            grad_points = torch.empty((self.n, 3), dtype=self.dtype, device=self.device)
        else:
            grad_rot = grad_points = self.unused
        if self.n:
            self.launch(grad_out, points, rotations, planes, grad_points, grad_rot, grad_planes)
        elif self.coordinate_grad:
            grad_points.zero_()
        if not self.coordinate_grad:
            return None, None, grad_planes
        return grad_points, grad_rot, grad_planes


_PLANS: PlanCache[BackwardPlan] = PlanCache("tomo_kplanes.tilted_plane_features_backward")


def backward_plan(
    points: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor, coordinate_grad: bool
) -> BackwardPlan:
    """The cached backward plan of validated inputs."""
    meta = (
        points.shape[0], rotations.shape[0], tuple(planes.shape), points.stride(),
        rotations.stride(), planes.stride(), planes.dtype, planes.device, bool(coordinate_grad),
        bool(PRE_REDUCE_RUNS),
    )  # fmt: skip
    return _PLANS.get(meta, lambda: BackwardPlan(*meta))


def compile_backward_ahead(plans, points, rotations, planes) -> None:
    """Compile the backward a training call will run (of ``plans``, by ``coordinate_grad``) on a
    background thread while the forward compiles; nothing when no backward follows."""
    if backward_follows(points, rotations, planes):
        plan = plans[bool(points.requires_grad or rotations.requires_grad)]
        plan.launch.compile_ahead(*(plan.dtype,) * 7)


class FeaturesPlan:
    """The forward launch and the two backward launches (with and without the coordinate
    gradients) of one kind of call, bound once."""

    def __init__(self, points, rotations, planes) -> None:
        self.forward = forward_plan(points, rotations, planes)
        self.backward_plans = {
            need: backward_plan(points, rotations, planes, need) for need in (False, True)
        }

    def backward(self, grad_out, points, rotations, planes, needs, grad_planes=None):
        """``(grad_points, grad_rotations, grad_planes)`` of a contiguous ``grad_out``; the first
        two are ``None`` where ``needs`` asks for neither (the kernel then skips them).
        ``grad_planes`` as in :class:`BackwardPlan`."""
        coordinate_grad = bool(needs[0] or needs[1])
        plan = self.backward_plans[coordinate_grad]
        if plan.runs != PRE_REDUCE_RUNS:  # switched since the plan was made
            plan = backward_plan(points, rotations, planes, coordinate_grad)
        return plan(grad_out, points, rotations, planes, grad_planes)


def features_plan(points, rotations, planes) -> FeaturesPlan:
    """The plan of validated inputs, its backward compiled ahead where one will follow."""
    plan = FeaturesPlan(points, rotations, planes)
    compile_backward_ahead(plan.backward_plans, points, rotations, planes)
    return plan
