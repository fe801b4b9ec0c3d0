"""Triton forward of ``tilted_plane_features``: one program per (block of points, rotation)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton_dispatch import autotune, config_space, next_power_of_2
from triton_dispatch.launch import KernelLaunch, PlanCache

from .sampling import rotated_coordinates, sample_plane


# fmt: off
@autotune(
    config_space({"BLOCK_N": [32, 64, 128]}, num_warps=[2, 4, 8], num_stages=[1]),
    key=["BLOCK_C", "T_BUCKET"],
    interpret_config=triton.Config({"BLOCK_N": 16}, num_warps=1, num_stages=1),
)
@triton.jit(do_not_specialize=["H", "W"])
def _forward_kernel(
    points_ptr, rot_ptr, planes_ptr, out_ptr,
    N, C, H, W,
    stride_pn, stride_pd,
    stride_rt, stride_ri, stride_rj,
    stride_lp, stride_lc, stride_lh, stride_lw,
    stride_on, stride_oc,
    T_BUCKET,
    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid_n = tl.program_id(0)
    t = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, BLOCK_C)
    n_mask = offs_n < N
    mask = n_mask[:, None] & (offs_c < C)[None, :]

    px = tl.load(points_ptr + offs_n * stride_pn, mask=n_mask, other=0.0)
    py = tl.load(points_ptr + offs_n * stride_pn + stride_pd, mask=n_mask, other=0.0)
    pz = tl.load(points_ptr + offs_n * stride_pn + 2 * stride_pd, mask=n_mask, other=0.0)
    qx, qy, qz, valid, _, _, _, _, _, _, _, _, _ = rotated_coordinates(
        rot_ptr + t * stride_rt, stride_ri, stride_rj, px, py, pz
    )

    c_off = (offs_c * stride_lc)[None, :]
    base = planes_ptr + (3 * t).to(tl.int64) * stride_lp
    s_xy = sample_plane(base, c_off, mask, qx, qy, W, H, stride_lh, stride_lw)
    s_zx = sample_plane(base + stride_lp, c_off, mask, qz, qx, W, H, stride_lh, stride_lw)
    s_yz = sample_plane(base + 2 * stride_lp, c_off, mask, qy, qz, W, H, stride_lh, stride_lw)

    out = tl.where(valid[:, None], s_xy * s_zx * s_yz, float("nan"))
    out_ptrs = out_ptr + offs_n.to(tl.int64)[:, None] * stride_on + (t * C + offs_c)[None, :] * stride_oc
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)
# fmt: on


def bound_arguments(n, t, plane_shape, points_stride, rot_stride, planes_stride) -> dict:
    """The launch arguments the forward and backward kernels share, fixed by a plan."""
    _, c, h, w = plane_shape
    names = (
        "stride_pn", "stride_pd", "stride_rt", "stride_ri", "stride_rj",
        "stride_lp", "stride_lc", "stride_lh", "stride_lw",
    )  # fmt: skip
    strides = (*points_stride, *rot_stride, *planes_stride)
    return {
        "N": n, "C": c, "H": h, "W": w, **dict(zip(names, strides)),
        "T_BUCKET": min(next_power_of_2(t), 8), "BLOCK_C": next_power_of_2(c),
    }  # fmt: skip


class ForwardPlan:
    """The forward launch of one kind of call (sizes, strides, dtype, device), bound once."""

    def __init__(self, n, t, plane_shape, points_stride, rot_stride, planes_stride, dtype, device):
        c = plane_shape[1]
        self.shape, self.dtype, self.device = (n, t * c), dtype, device
        bound = bound_arguments(n, t, plane_shape, points_stride, rot_stride, planes_stride)
        self.launch = KernelLaunch(
            _forward_kernel,
            lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), t),
            dict(bound, stride_on=t * c, stride_oc=1),
            device=device,
        )

    def __call__(self, points, rotations, planes) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        if self.shape[0]:
            self.launch(points, rotations, planes, out)
        return out


_PLANS: PlanCache[ForwardPlan] = PlanCache("tomo_kplanes.tilted_plane_features_forward")


def forward_plan(
    points: torch.Tensor, rotations: torch.Tensor, planes: torch.Tensor
) -> ForwardPlan:
    """The cached forward plan of validated inputs."""
    meta = (
        points.shape[0], rotations.shape[0], tuple(planes.shape), points.stride(),
        rotations.stride(), planes.stride(), planes.dtype, planes.device,
    )  # fmt: skip
    return _PLANS.get(meta, lambda: ForwardPlan(*meta))
